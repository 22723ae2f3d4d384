//! The ownership protocol of one in-flight slot of the runtime: who may touch the slot's
//! execution record (the runtime's `SlotInfo`, kept next to this ticket) and when.
//!
//! # Protocol
//!
//! ```text
//!   stager (staging lock)          harvest (harvest token)           owner (the retirer)
//!   is_free()                      seq = current()                   completed(seq) == Some
//!   <write the record>             <read the record>                 <read / clear the record>
//!   publish(seq)   ──Release──►    complete(seq, status) ─Release─►  release()  ──Release──►
//!                                                                    (the stager's is_free())
//! ```
//!
//! Each step hands the record to the next with a Release store that the next one acquires:
//! the stager writes the record and then the ticket; the harvest reads the record only while
//! the ticket names its execution and before writing the completion word; the owner reads and
//! clears the record after acquiring the completion word, then frees the ticket; a stager
//! reuses the slot only after acquiring the freed ticket. So the record is never written
//! while another side reads it. The protocol is model-checked in `tests/loom.rs`
//! (`slot_ticket_*`), against the same code the runtime runs.
//!
//! # Who writes what
//!
//! | word | written by | ordering |
//! |---|---|---|
//! | `ticket` (seq of the occupying execution; 0 = free) | the stager (`publish`, under the staging lock), the owner (`release`) | `Release`; read `Acquire` |
//! | `done` (`seq << 16 \| status`) | the stager resets it (`Relaxed`, before `publish`), the harvest writes it once (`complete`) | `Release`; read `Acquire` |

use crate::sync::{AtomicU64, Ordering};

/// The ticket and completion word of one in-flight slot; see the module docs.
#[derive(Debug)]
pub struct SlotTicket {
    ticket: AtomicU64,
    done: AtomicU64,
}

impl Default for SlotTicket {
    fn default() -> Self {
        Self::new()
    }
}

impl SlotTicket {
    /// A free slot.
    pub fn new() -> Self {
        SlotTicket {
            ticket: AtomicU64::new(0),
            done: AtomicU64::new(0),
        }
    }

    /// Whether the slot is free (stager, before writing the record).
    #[inline(always)]
    pub fn is_free(&self) -> bool {
        self.ticket.load(Ordering::Acquire) == 0
    }

    /// Publishes the record just written for execution `seq` (> 0): the harvest and the
    /// owner may read it from now on.
    #[inline(always)]
    pub fn publish(&self, seq: u64) {
        debug_assert!(seq != 0 && seq < 1 << 48);
        self.done.store(0, Ordering::Relaxed);
        self.ticket.store(seq, Ordering::Release);
    }

    /// The seq of the execution occupying the slot (0: free). A non-zero value makes the
    /// record readable until the completion word is written.
    #[inline(always)]
    pub fn current(&self) -> u64 {
        self.ticket.load(Ordering::Acquire)
    }

    /// Writes execution `seq`'s completion word (the harvest, once): the record passes to
    /// the owner.
    #[inline(always)]
    pub fn complete(&self, seq: u64, status: u16) {
        self.done
            .store(seq << 16 | status as u64, Ordering::Release);
    }

    /// Execution `seq`'s status, once its completion word is written.
    #[inline(always)]
    pub fn completed(&self, seq: u64) -> Option<u16> {
        let w = self.done.load(Ordering::Acquire);
        (w >> 16 == seq).then_some(w as u16)
    }

    /// Frees the slot (the owner, after it is done with the record).
    #[inline(always)]
    pub fn release(&self) {
        self.ticket.store(0, Ordering::Release);
    }
}
