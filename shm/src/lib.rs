//! Intra-node transport for ibcoll.
//!
//! The ranks of one job that share a node talk through one shared segment in
//! `/dev/shm` ([`segment`], [`node`]), laid out by [`layout`]: a header, one
//! multi-producer receive queue per local rank ([`queue`]), a pool of small
//! single-producer/single-consumer fast boxes per local rank, each granted
//! to one sender ([`ring`]; both on 64-byte cells), one futex doorbell per rank for blocking waits ([`doorbell`]),
//! one pid slot per rank (and, for ranks that also block in `poll(2)`, a wake-up
//! FIFO: [`wake`]), optional pipelined-copy areas, one per sending rank ([`pipeline`]) and a
//! free `extra` area, which fast paths use as publication slots ([`slots`]). Large messages move with one
//! copy through `process_vm_readv`/`process_vm_writev` ([`cma`]) when the
//! kernel permits it, and through the pipeline areas otherwise.
//!
//! Nothing here knows about ranks outside the node or about collectives.

#![warn(missing_docs)]

pub mod backoff;
mod cells;
pub mod cma;
pub mod doorbell;
pub mod error;
pub mod fences;
pub mod header;
pub mod layout;
pub mod node;
pub mod pipeline;
pub mod queue;
pub mod ring;
pub mod rndv;
pub mod segment;
pub mod slots;
pub mod wake;

pub use backoff::{Backoff, Step};
pub use cma::{allow_peer_access, cma_probe, cma_read, cma_write, pid_alive};
pub use doorbell::{Doorbell, SleepOutcome, WaitPolicy, WaitStep, Waiter};
pub use error::{Result, ShmError};
pub use header::SegmentHeader;
pub use layout::{LayoutParams, NodeLayout, CACHE_LINE, PAGE};
pub use node::NodeSegment;
pub use pipeline::{PipeReceiver, PipeSender};
pub use queue::{Intent, QueueConsumer, QueueProducer, QueueRecord};
pub use ring::{RecordRef, RingConsumer, RingProducer};
pub use rndv::{ClaimSlot, CLAIM_SLOTS};
pub use segment::{cleanup_job, segment_name, Segment, SHM_DIR};
pub use slots::{
    SlotArea, SlotHeader, SlotLayout, SLOT_BUFFERS, SLOT_HEADER, SLOT_INLINE, SLOT_LINES,
};
pub use wake::{wake_path, WakeFifo, WakeWriter};
