#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| baton_link::fuzzing::link_frames(data));
