//! Fuzzes the reader of runtime-directory records (`nrt ls`, `monitor`, `top`, a runtime
//! naming a core's owner): a valid record with the input's patches applied — each 10 bytes
//! a word index (`u16`) and a value (`u64`) — must parse to a record whose values every
//! consumer can sum without overflow, or to an error saying why; never a panic, a loop sized
//! by a value, or an unbounded allocation. (Random bytes would never be a record's exact
//! size; patches of a valid one reach every check.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use nrt_runtime::host::{self, Header, Record};

fuzz_target!(|data: &[u8]| {
    let words = std::mem::size_of::<Record>() / 8;
    let mut rec = vec![0u64; words];
    let header_words = std::mem::size_of::<Header>() / 8;
    rec[0] = host::RECORD_MAGIC;
    rec[1] = host::RECORD_VERSION;
    rec[2] = 1; // holding
    rec[3] = 4242; // pid
    rec[5] = 1; // lnc
    rec[6] = 2; // vcores
    rec[header_words + 1] = 1; // vcore 0: one core
    for p in data.chunks_exact(10) {
        let i = u16::from_le_bytes([p[0], p[1]]) as usize % words;
        rec[i] = u64::from_le_bytes(p[2..10].try_into().unwrap());
    }
    let bytes: Vec<u8> = rec.iter().flat_map(|w| w.to_le_bytes()).collect();
    let Ok(r) = host::parse_record(&bytes) else {
        return;
    };
    // What the readers do with a record, in plain (overflow-checked) arithmetic.
    let mut hist = vec![0u64; host::HIST_BUCKETS];
    let (mut done, mut bytes_used, mut busy) = (0u64, 0u64, 0u64);
    for v in &r.vcores {
        assert!(v.first_core as u64 + v.cores as u64 <= 256);
        done += v.status.iter().sum::<u64>() + v.errors.iter().sum::<u64>();
        bytes_used += v.mem.iter().sum::<u64>();
        busy += v.busy_ns;
        for (h, x) in hist.iter_mut().zip(&v.lat_total) {
            *h += x;
        }
        for _core in v.first_core..v.first_core + v.cores.max(1) {}
    }
    for m in &r.models {
        bytes_used += m.mem.iter().sum::<u64>();
    }
    let _ = (done, bytes_used, busy, host::percentile(&hist, 99.0));
    assert!(r.cmdline.len() <= host::CMDLINE_BYTES * 3 && r.tag.len() <= host::TAG_BYTES * 3);
});
