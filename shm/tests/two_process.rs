//! Two processes sharing one node segment: the test binary re-runs itself
//! as the child (selected by an environment variable), so the child runs
//! this crate's code exactly as a second rank would.

mod common;

use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{check_record, record, unique};
use ibcoll_shm::{
    cma_probe, cma_read, cma_write, pid_alive, LayoutParams, NodeLayout, NodeSegment, ShmError,
    WaitPolicy, WaitStep, Waiter,
};

const ROLE_ENV: &str = "IBCOLL_SHM_TEST_ROLE";
const SEG_ENV: &str = "IBCOLL_SHM_TEST_SEGMENT";
const RECORDS: u64 = 100_000;
const RING_BYTES: usize = 64 * 1024;
/// Largest record of the 100k-record stream: some wrap-around padding, but
/// mostly small records, like an engine's eager traffic.
const RECORD_MAX: usize = 4096;
const PIPE_MSG: usize = 3 * 1024 * 1024 + 5;

fn records_layout() -> NodeLayout {
    NodeLayout::new(2, RING_BYTES, 4096).unwrap()
}

fn pipe_layout() -> NodeLayout {
    NodeLayout::from_params(LayoutParams {
        local_size: 2,
        ring_bytes: RING_BYTES,
        boxes: 1,
        queue_bytes: 0,
        pipe_slots: 4,
        pipe_chunk: 16 * 1024,
        extra_bytes: 4096,
    })
    .unwrap()
}

/// Spin briefly, then block: yielding is slow when other processes share
/// the two CPUs, and these tests must stay quick on a loaded machine.
fn policy() -> WaitPolicy {
    WaitPolicy {
        spins: 500,
        yields: 0,
        block_timeout: Duration::from_millis(20),
    }
}

/// Control words in the segment's `extra` area.
fn words(node: &NodeSegment) -> &[AtomicU64] {
    // SAFETY: the extra area is page aligned, at least 4096 bytes, lives as
    // long as `node`, and is only accessed atomically by these tests.
    unsafe { std::slice::from_raw_parts(node.extra_ptr() as *const AtomicU64, 8) }
}

/// Kills the child if the parent's test fails before reaping it.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl ChildGuard {
    fn spawn(role: &str, segment: &str) -> ChildGuard {
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["child_main", "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, role)
            .env(SEG_ENV, segment)
            .spawn()
            .unwrap();
        ChildGuard(child)
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// Panics if the child has exited; called between bounded waits.
    fn assert_running(&mut self) {
        if let Some(status) = self.0.try_wait().unwrap() {
            panic!("child exited early: {status}");
        }
    }

    fn wait_success(&mut self) {
        let status = self.0.wait().unwrap();
        assert!(status.success(), "child failed: {status}");
    }
}

/// Entry point of the child process; does nothing in a normal test run.
#[test]
fn child_main() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let name = std::env::var(SEG_ENV).unwrap();
    match role.as_str() {
        "records" => child_records(&name),
        "cma" => child_cma(&name),
        "pipe" => child_pipe(&name),
        other => panic!("unknown role {other}"),
    }
}

/// Waits for `ready`, checking between bounded blocks that rank 0 lives.
fn child_wait(node: &NodeSegment, waiter: &mut Waiter, ready: impl FnMut() -> bool) {
    if waiter.step(node.doorbell(1), ready) == WaitStep::TimedOut {
        assert!(pid_alive(node.pid(0)), "parent died");
    }
}

fn child_records(name: &str) {
    let node = NodeSegment::open(name, records_layout()).unwrap();
    node.publish_pid(1);
    // SAFETY: rank 1 holds the only consumer of 0->1 and producer of 1->0;
    // both are dropped before `node`.
    let (mut rx, mut tx) = unsafe {
        (
            node.box_consumer(1, 0).unwrap(),
            node.box_producer(0, 0).unwrap(),
        )
    };
    let mut waiter = Waiter::new(policy());
    let mut i = 0;
    while i < RECORDS {
        let Some(rec) = rx.peek() else {
            child_wait(&node, &mut waiter, || !rx.is_empty());
            continue;
        };
        waiter.reset();
        check_record(i, RECORD_MAX, &rec);
        rec.consume();
        // The parent rings us after draining acks.
        while !tx.try_push(&[&i.to_le_bytes()]) {
            child_wait(&node, &mut waiter, || tx.can_push(8));
        }
        node.doorbell(0).ring();
        i += 1;
    }
}

#[test]
fn hundred_thousand_records_between_processes() {
    let name = unique("records");
    let node = NodeSegment::create(&name, records_layout()).unwrap();
    node.publish_pid(0);
    let mut child = ChildGuard::spawn("records", &name);
    // SAFETY: rank 0 holds the only producer of 0->1 and consumer of 1->0;
    // both are dropped before `node`.
    let (mut tx, mut rx) = unsafe {
        (
            node.box_producer(1, 0).unwrap(),
            node.box_consumer(0, 0).unwrap(),
        )
    };
    let mut waiter = Waiter::new(policy());
    let (mut sent, mut acked) = (0u64, 0u64);
    let mut pending = record(0, RECORD_MAX);
    while acked < RECORDS {
        let mut progress = false;
        if sent < RECORDS {
            let (head, tail) = pending.split_at(pending.len().min(32));
            if tx.try_push(&[head, tail]) {
                node.doorbell(1).ring();
                sent += 1;
                pending = record(sent, RECORD_MAX);
                progress = true;
            }
        }
        let acked_before = acked;
        while let Some(ack) = rx.peek() {
            assert_eq!(&ack[..], &acked.to_le_bytes(), "ack out of order");
            ack.consume();
            acked += 1;
        }
        if acked > acked_before {
            node.doorbell(1).ring();
            progress = true;
        }
        if progress {
            waiter.reset();
        } else if waiter.step(node.doorbell(0), || !rx.is_empty()) == WaitStep::TimedOut {
            child.assert_running();
        }
    }
    child.wait_success();
    assert_eq!(node.header().attached(), 2);
    node.unlink().unwrap();
}

fn child_cma(name: &str) {
    let node = NodeSegment::open(name, records_layout()).unwrap();
    let w = words(&node);
    let src: Vec<u8> = (0..(1 << 20) + 13).map(|j| common::pattern(1, j)).collect();
    let dst = vec![0u8; src.len()];
    w[1].store(src.as_ptr() as u64, Ordering::Relaxed);
    w[2].store(dst.as_ptr() as u64, Ordering::Relaxed);
    w[3].store(src.len() as u64, Ordering::Relaxed);
    node.publish_pid(1);
    w[0].store(1, Ordering::Release);
    node.doorbell(0).ring();
    let mut waiter = Waiter::new(policy());
    while w[0].load(Ordering::Acquire) != 2 {
        child_wait(&node, &mut waiter, || w[0].load(Ordering::Acquire) == 2);
    }
    // The parent wrote `dst` behind our back; read it as fresh memory.
    let dst = std::hint::black_box(dst);
    for (j, &b) in dst.iter().enumerate() {
        assert_eq!(b, common::pattern(2, j), "byte {j} written by parent");
    }
}

#[test]
fn cma_read_and_write_to_a_child() {
    if let Err(e) = cma_probe() {
        println!("note: skipping CMA test, kernel denies it: {e}");
        return;
    }
    let name = unique("cma");
    let node = NodeSegment::create(&name, records_layout()).unwrap();
    node.publish_pid(0);
    let mut child = ChildGuard::spawn("cma", &name);
    let w = words(&node);
    let mut waiter = Waiter::new(policy());
    while w[0].load(Ordering::Acquire) != 1 {
        if waiter.step(node.doorbell(0), || w[0].load(Ordering::Acquire) == 1) == WaitStep::TimedOut
        {
            child.assert_running();
        }
    }
    let pid = node.pid(1);
    assert_eq!(pid, child.pid());
    let (src, dst) = (
        w[1].load(Ordering::Relaxed) as usize,
        w[2].load(Ordering::Relaxed) as usize,
    );
    let len = w[3].load(Ordering::Relaxed) as usize;
    let mut buf = vec![0u8; len];
    cma_read(pid, src, &mut buf).unwrap();
    for (j, &b) in buf.iter().enumerate() {
        assert_eq!(b, common::pattern(1, j), "byte {j} read from child");
    }
    let out: Vec<u8> = (0..len).map(|j| common::pattern(2, j)).collect();
    cma_write(pid, dst, &out).unwrap();
    w[0].store(2, Ordering::Release);
    node.doorbell(1).ring();
    child.wait_success();
    assert!(!pid_alive(pid));
    assert!(matches!(
        cma_read(pid, src, &mut buf[..8]),
        Err(ShmError::PeerGone { .. })
    ));
    node.unlink().unwrap();
}

fn child_pipe(name: &str) {
    let node = NodeSegment::open(name, pipe_layout()).unwrap();
    node.publish_pid(1);
    // SAFETY: rank 1 holds the only receiver of pipe 0->1, dropped before
    // `node`.
    let mut rx = unsafe { node.pipe_receiver(0).unwrap() };
    let mut buf = vec![0u8; PIPE_MSG];
    let mut got = 0;
    let mut waiter = Waiter::new(policy());
    while got < buf.len() {
        let n = rx.try_recv(&mut buf[got..]);
        if n > 0 {
            got += n;
            node.doorbell(0).ring();
            waiter.reset();
        } else {
            child_wait(&node, &mut waiter, || rx.is_ready());
        }
    }
    for (j, &b) in buf.iter().enumerate() {
        assert_eq!(b, common::pattern(3, j), "pipe byte {j}");
    }
}

#[test]
fn pipelined_copy_between_processes() {
    let name = unique("pipe");
    let node = NodeSegment::create(&name, pipe_layout()).unwrap();
    node.publish_pid(0);
    let mut child = ChildGuard::spawn("pipe", &name);
    // SAFETY: rank 0 holds the only sender of pipe 0->1, dropped before
    // `node`.
    let mut tx = unsafe { node.pipe_sender(0).unwrap() };
    let src: Vec<u8> = (0..PIPE_MSG).map(|j| common::pattern(3, j)).collect();
    let mut sent = 0;
    let mut waiter = Waiter::new(policy());
    while sent < src.len() {
        let n = tx.try_send(&src[sent..]);
        if n > 0 {
            sent += n;
            node.doorbell(1).ring();
            waiter.reset();
        } else if waiter.step(node.doorbell(0), || tx.can_send()) == WaitStep::TimedOut {
            child.assert_running();
        }
    }
    child.wait_success();
    node.unlink().unwrap();
}
