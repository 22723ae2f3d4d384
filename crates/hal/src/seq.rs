//! Sequence ids of the NRT 3.0 async API: a 16-bit execution-unit id above a 48-bit,
//! strictly increasing per-XU sequence number.
//!
//! `seq_id = (seq & 0xFFFF_FFFF_FFFF) | (xu_id << 48)` — exactly what `xuq_client_submit`
//! computes in the seed and what `nrt_async.h` calls `NRTA_SEQ_GET_SEQ_NUM` /
//! `NRTA_SEQ_GET_XU_ID`.

/// Largest sequence number (`NRTA_SEQ_NUM_MAX`, also the mask of the number's bits).
pub const NRTA_SEQ_NUM_MAX: u64 = (1 << 48) - 1;
/// Mask of the sequence-number bits (`NRTA_SEQ_NUM_MASK`).
pub const NRTA_SEQ_NUM_MASK: u64 = NRTA_SEQ_NUM_MAX;

/// A packed sequence id (`nrta_seq_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

impl SeqId {
    /// Packs a sequence number and an execution-unit id.
    pub const fn new(xu_id: u16, seq: u64) -> SeqId {
        SeqId((seq & NRTA_SEQ_NUM_MASK) | ((xu_id as u64) << 48))
    }

    /// The sequence number (`NRTA_SEQ_GET_SEQ_NUM`).
    pub const fn seq_num(self) -> u64 {
        self.0 & NRTA_SEQ_NUM_MASK
    }

    /// The execution-unit id (`NRTA_SEQ_GET_XU_ID`).
    pub const fn xu_id(self) -> u16 {
        (self.0 >> 48) as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_matches_the_public_macros() {
        assert_eq!(NRTA_SEQ_NUM_MAX, 0xFFFF_FFFF_FFFF);
        let s = SeqId::new(0x0203, 0x1234);
        assert_eq!(s.0, 0x0203_0000_0000_1234);
        assert_eq!(s.seq_num(), 0x1234);
        assert_eq!(s.xu_id(), 0x0203);
        // The number wraps into 48 bits; it never spills into the XU id.
        assert_eq!(SeqId::new(1, 1 << 48).0, 1 << 48);
    }

    proptest! {
        #[test]
        fn round_trips(xu in any::<u16>(), seq in 0..=NRTA_SEQ_NUM_MAX) {
            let s = SeqId::new(xu, seq);
            prop_assert_eq!(s.xu_id(), xu);
            prop_assert_eq!(s.seq_num(), seq);
        }
    }
}
