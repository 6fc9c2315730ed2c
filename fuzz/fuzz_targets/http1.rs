#![no_main]
// A server's response heads and chunked bodies (bench), and a browser's proxy request heads
// (`baton record`): the same bytes through both parsers.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    baton_bench::fuzzing::http1(data);
    baton_recorder::fuzzing::connect(data);
});
