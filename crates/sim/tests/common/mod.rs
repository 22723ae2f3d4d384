//! Helpers shared by the device tests: a device, record filters, waiting for the device
//! thread to finish its requests, and the instruction blocks of a core.

#![allow(dead_code)]

use nrt_hal::{NqRecord, RecordKind};
use nrt_sim::{SimConfig, SoftDevice};
use std::time::{Duration, Instant};

pub const T: Duration = Duration::from_secs(10);

pub fn device() -> SoftDevice {
    SoftDevice::new(SimConfig {
        memory_bytes: 1 << 30,
        ..SimConfig::default()
    })
    .unwrap()
}

pub fn kinds(recs: &[NqRecord], kind: RecordKind) -> Vec<(u32, u8)> {
    recs.iter()
        .filter(|r| r.record_kind() == Some(kind))
        .map(|r| (r.compute_idx, r.engine))
        .collect()
}

/// Waits (at most `T`) until core 0 has taken `taken` requests in all and the device thread
/// has parked again: it parks only after a bounded spin with nothing to run (a stalled
/// execution keeps it polling until the watchdog fires), so every request it took has then
/// finished, failed or been abandoned, and its records are in the rings. The request count
/// rules out the moment the thread re-checks for work on its way out of a park (its parked
/// flag is briefly set then), which a preempted device thread can stretch.
pub fn wait_until_done(dev: &SoftDevice, taken: u64) {
    let t0 = Instant::now();
    while dev.executions(0).unwrap() < taken || !dev.is_parked() {
        assert!(
            t0.elapsed() < T,
            "the device never finished request {taken}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn errors(recs: &[NqRecord]) -> Vec<(u8, u8)> {
    recs.iter()
        .filter(|r| r.record_kind() == Some(RecordKind::Error))
        .map(|r| (r.subtype, r.engine))
        .collect()
}

/// One core's instruction blocks, by engine.
pub type Blocks = [nrt_hal::DevAddr; nrt_hal::NUM_ENGINES];
