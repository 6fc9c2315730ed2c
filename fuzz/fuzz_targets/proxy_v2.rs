#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| baton_wire::fuzzing::proxy_v2(data));
