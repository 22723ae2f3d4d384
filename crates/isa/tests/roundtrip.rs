//! Property tests: every valid instruction encodes and decodes to itself; decoding arbitrary
//! bytes never panics. (A corrupted field reported with its name and offset, and the
//! fields rejected: `rejected_fields.rs`.)

mod common;

use common::*;
use nrt_hal::Engine;
use nrt_isa::op;
use nrt_isa::*;
use proptest::prelude::*;

fn engine_for(op: &Op) -> Engine {
    *Engine::ALL.iter().find(|e| op.runs_on(**e)).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_instruction_round_trips(sync in arb_sync(), op in arb_op()) {
        let ins = Instruction { sync, op };
        let mut bytes = Vec::new();
        ins.encode(&mut bytes);
        prop_assert_eq!(bytes.len(), ins.encoded_len());
        prop_assert_eq!(bytes.len() % 8, 0);
        let (back, len) = Instruction::decode(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(len, bytes.len());
        prop_assert_eq!(back, ins);
    }

    /// A written operand given a stride of 0 on a dimension of size > 1 (two of its
    /// elements on one address) is refused, naming the operand (or one of its fields, where
    /// the op requires it dense); a read operand's broadcast
    /// within the bounds still decodes (the generator's own broadcasts round-trip above).
    #[test]
    fn a_written_operand_that_repeats_elements_is_refused(op in arb_op()) {
        let mut bad = op;
        let mut target = None;
        bad.operands_mut(|o| {
            if target.is_none()
                && o.role.writes()
                && o.ap.elements() > 0
                && let Some(d) = (0..4).find(|&d| o.ap.shape[d] > 1)
            {
                o.ap.stride[d] = 0;
                target = Some(o.name);
            }
        });
        let Some(name) = target else { return Ok(()) };
        let mut bytes = Vec::new();
        Instruction::new(bad).encode(&mut bytes);
        let e = Instruction::decode(&bytes).expect_err("a repeating output decoded");
        // An operand an op requires dense (a convolution's workspace) is refused by that
        // op's own check first, naming a field of the operand.
        prop_assert!(
            e.field == name || e.field.strip_prefix(name).is_some_and(|f| f.starts_with('.')),
            "refused {} instead of {}", e.field, name
        );
        if e.field == name {
            prop_assert_eq!(e.reason, Reason::OverlappingWrite);
        }
    }

    #[test]
    fn blocks_round_trip(ops in prop::collection::vec(arb_op(), 0..8)) {
        // Keep only ops that run on the engine of the first one, then end the block.
        let engine = ops.first().map(engine_for).unwrap_or(Engine::Sp);
        let ins: Vec<Instruction> = ops.into_iter()
            .filter(|o| o.runs_on(engine) && !matches!(o, Op::End(op::End)))
            .map(Instruction::new)
            .collect();
        let block = encode_block(&ins);
        let back = decode_block(&block, engine).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(back.len(), ins.len() + 1);
        for (i, (_, d)) in back.iter().enumerate().take(ins.len()) {
            prop_assert_eq!(*d, ins[i]);
        }
    }

    /// The operand table agrees with the encoder: adding 4096 to the 8-byte address at each
    /// listed operand's slot moves exactly that operand (and nothing else), and every
    /// operand the encoder wrote is listed — a table that names a wrong slot, misses an
    /// operand or lists one twice fails here, not on the device.
    #[test]
    fn operand_table_matches_the_encoding(sync in arb_sync(), op in arb_op()) {
        let ins = Instruction { sync, op };
        let mut bytes = Vec::new();
        ins.encode(&mut bytes);
        let mut slots = Vec::new();
        ins.op.operands(|o| slots.push((o.slot, o.name, o.role, *o.ap)));
        let mut seen = std::collections::BTreeSet::new();
        for &(slot, _, _, _) in &slots {
            prop_assert!(seen.insert(slot), "slot {} listed twice", slot);
        }
        let mut moved = bytes.clone();
        for &(slot, _, _, _) in &slots {
            let at = HEADER_SIZE + slot * nrt_isa::AP_SIZE;
            let addr = u64::from_le_bytes(moved[at..at + 8].try_into().unwrap());
            moved[at..at + 8].copy_from_slice(&(addr.wrapping_add(4096)).to_le_bytes());
        }
        let (back, _) = Instruction::decode(&moved).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut expect = ins;
        expect.op.operands_mut(|o| o.ap.addr = o.ap.addr.wrapping_add(4096));
        prop_assert_eq!(back, expect);
        // The same operands, through address_fields (what relocations and the loader use).
        let mut fields = Vec::new();
        ins.address_fields(|f| fields.push((f.offset, f.name)));
        if !matches!(ins.op, Op::DmaDescriptors(_)) {
            let want: Vec<_> = slots.iter().map(|&(s, n, _, _)| (HEADER_SIZE + s * nrt_isa::AP_SIZE, n)).collect();
            prop_assert_eq!(fields, want);
        }
        // Only an accumulating MatMul and a scatter read the operand they write.
        for &(_, name, role, _) in &slots {
            if role == nrt_isa::Role::ReadWrite {
                let accumulating = matches!(ins.op, Op::MatMul(op::MatMul { flags, .. }) if flags & nrt_isa::matmul_flags::ACCUMULATE != 0);
                let scatter = matches!(ins.op, Op::ScatterElements(_));
                prop_assert!(accumulating || scatter);
                prop_assert_eq!(name, if scatter { "output" } else { "c" });
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400), engine in 0u8..5) {
        let _ = decode_block(&bytes, Engine::from_index(engine).unwrap());
    }

    #[test]
    fn single_byte_corruption_never_panics(sync in arb_sync(), op in arb_op(), at in any::<prop::sample::Index>(), v in any::<u8>()) {
        let mut bytes = Vec::new();
        Instruction { sync, op }.encode(&mut bytes);
        let i = at.index(bytes.len());
        bytes[i] = v;
        let _ = Instruction::decode(&bytes);
    }
}
