//! Two-process micro-benchmark of the intra-node transport.
//!
//! `cargo run --release -p ibcoll-shm --example ring_pingpong [iters]`
//! (`RB=<bytes>` sets the ring capacity, default 64 KiB)
//!
//! Prints the half round-trip time of 8-byte and 40-byte (32-byte engine
//! header + 8 bytes) ring ping-pongs, the streaming bandwidth of 4 KiB
//! records copied out of the ring, single-copy (CMA) bandwidth for 1 and
//! 4 MiB, and pipelined-copy bandwidth for 1 MiB. The process re-runs
//! itself as the peer; each side is pinned to CPU 0 or 1.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ibcoll_shm::{
    cma_probe, cma_read, cma_write, segment_name, LayoutParams, NodeLayout, NodeSegment,
    RingConsumer, RingProducer,
};

const MIB: usize = 1 << 20;
const BIG: usize = 4 * MIB;
const PIPE_ROUNDS: usize = 200;
const STREAM_RECORDS: usize = 100_000;
const STREAM_BYTES: usize = 4096;

fn layout() -> NodeLayout {
    NodeLayout::from_params(LayoutParams {
        local_size: 2,
        ring_bytes: std::env::var("RB").map_or(64 * 1024, |v| v.parse().unwrap()),
        boxes: 1,
        queue_bytes: 0,
        pipe_slots: 4,
        pipe_chunk: 64 * 1024,
        extra_bytes: 4096,
    })
    .unwrap()
}

fn words(node: &NodeSegment) -> &[AtomicU64] {
    // SAFETY: the extra area is page aligned, 4096 bytes, lives as long as
    // `node` and is only accessed atomically here.
    unsafe { std::slice::from_raw_parts(node.extra_ptr() as *const AtomicU64, 8) }
}

fn pin(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it and
    // sched_setaffinity only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn spin_until(w: &AtomicU64, v: u64) {
    while w.load(Ordering::Acquire) != v {
        std::hint::spin_loop();
    }
}

/// Busy-polls for one record and returns its first byte.
#[inline]
fn recv(rx: &mut RingConsumer) -> u8 {
    loop {
        if let Some(r) = rx.peek() {
            let b = r[0];
            r.consume();
            return b;
        }
        std::hint::spin_loop();
    }
}

#[inline]
fn send(tx: &mut RingProducer, parts: &[&[u8]]) {
    while !tx.try_push(parts) {
        std::hint::spin_loop();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() > 2 && args[1] == "--child" {
        child(&args[2], args[3].parse().unwrap());
        return;
    }
    let iters: u64 = args.get(1).map_or(1_000_000, |a| a.parse().unwrap());
    let name = segment_name(&format!("pingpong{}", std::process::id()), 0);
    let node = NodeSegment::create(&name, layout()).unwrap();
    let mut peer = Command::new(std::env::current_exe().unwrap())
        .args(["--child", &name, &iters.to_string()])
        .spawn()
        .unwrap();
    pin(0);
    // SAFETY: rank 0 owns producer 0->1, consumer 1->0 and pipe sender
    // 0->1; all are dropped before `node`.
    let (mut tx, mut rx, mut pipe) = unsafe {
        (
            node.box_producer(1, 0).unwrap(),
            node.box_consumer(0, 0).unwrap(),
            node.pipe_sender(0).unwrap(),
        )
    };
    let w = words(&node);
    spin_until(&w[0], 1);
    node.unlink().unwrap();

    for (label, header) in [("8 B", 0usize), ("32 B header + 8 B", 32)] {
        let hdr = [7u8; 32];
        let payload = 42u64.to_le_bytes();
        let parts: [&[u8]; 2] = [&hdr[..header], &payload];
        for _ in 0..iters / 10 {
            send(&mut tx, &parts);
            recv(&mut rx);
        }
        // Batches of 1000 round trips: the mean, and the min and median
        // batch (robust against a noisy neighbour preempting either side).
        let t = Instant::now();
        let mut batches = Vec::new();
        for _ in 0..iters.div_ceil(1000) {
            let tb = Instant::now();
            for _ in 0..1000 {
                send(&mut tx, &parts);
                recv(&mut rx);
            }
            batches.push(tb.elapsed().as_nanos() as f64 / 2000.0);
        }
        let ns = t.elapsed().as_nanos() as f64 / (batches.len() * 1000) as f64 / 2.0;
        batches.sort_by(|a, b| a.total_cmp(b));
        println!(
            "ring ping-pong {label:>18}: half-RTT {ns:7.1} ns (batches of 1000: min {:.1}, median {:.1})",
            batches[0],
            batches[batches.len() / 2]
        );
    }

    // Eager-style streaming: the receiver copies each record out.
    let payload = vec![3u8; STREAM_BYTES];
    let t = Instant::now();
    for _ in 0..STREAM_RECORDS {
        send(&mut tx, &[&[9u8; 32], &payload]);
    }
    recv(&mut rx);
    let gbs = (STREAM_RECORDS * STREAM_BYTES) as f64 / t.elapsed().as_secs_f64() / 1e9;
    println!("ring stream of 4 KiB records (copied out): {gbs:6.2} GB/s");

    // The child now publishes its buffer for single-copy transfers.
    spin_until(&w[0], 2);
    let pid = w[1].load(Ordering::Relaxed) as i32;
    let remote = w[2].load(Ordering::Relaxed) as usize;
    let mut local = vec![1u8; BIG];
    match cma_probe() {
        Err(e) => println!("CMA unavailable: {e}"),
        Ok(()) => {
            for size in [MIB, BIG] {
                let reps = (512 * MIB / size).max(1);
                cma_read(pid, remote, &mut local[..size]).unwrap();
                let t = Instant::now();
                for _ in 0..reps {
                    cma_read(pid, remote, &mut local[..size]).unwrap();
                }
                let gbs = (reps * size) as f64 / t.elapsed().as_secs_f64() / 1e9;
                let t = Instant::now();
                for _ in 0..reps {
                    cma_write(pid, remote, &local[..size]).unwrap();
                }
                let wgbs = (reps * size) as f64 / t.elapsed().as_secs_f64() / 1e9;
                println!(
                    "CMA {:>2} MiB: read {gbs:6.2} GB/s, write {wgbs:6.2} GB/s",
                    size / MIB
                );
            }
        }
    }
    w[0].store(3, Ordering::Release);

    // Pipelined copy of 1 MiB messages; the child acks each one on the ring.
    let t = Instant::now();
    for _ in 0..PIPE_ROUNDS {
        let mut sent = 0;
        while sent < MIB {
            sent += pipe.try_send(&local[sent..MIB]);
        }
        recv(&mut rx);
    }
    let gbs = (PIPE_ROUNDS * MIB) as f64 / t.elapsed().as_secs_f64() / 1e9;
    println!("pipelined copy 1 MiB (4 x 64 KiB slots): {gbs:6.2} GB/s");
    assert!(peer.wait().unwrap().success());
}

fn child(name: &str, iters: u64) {
    // A busy-polling orphan would skew every later measurement.
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    pin(1);
    let node = NodeSegment::open(name, layout()).unwrap();
    // SAFETY: rank 1 owns consumer 0->1, producer 1->0 and pipe receiver
    // 0->1; all are dropped before `node`.
    let (mut rx, mut tx, mut pipe) = unsafe {
        (
            node.box_consumer(1, 0).unwrap(),
            node.box_producer(0, 0).unwrap(),
            node.pipe_receiver(0).unwrap(),
        )
    };
    let w = words(&node);
    w[0].store(1, Ordering::Release);
    let reply = 43u64.to_le_bytes();
    for _ in 0..2 * (iters.div_ceil(1000) * 1000 + iters / 10) {
        recv(&mut rx);
        send(&mut tx, &[&reply]);
    }
    let mut sink = vec![0u8; STREAM_BYTES + 32];
    for _ in 0..STREAM_RECORDS {
        loop {
            if let Some(r) = rx.peek() {
                sink[..r.len()].copy_from_slice(&r);
                r.consume();
                break;
            }
            std::hint::spin_loop();
        }
    }
    std::hint::black_box(&sink);
    send(&mut tx, &[&reply]);
    let buf = vec![5u8; BIG];
    w[1].store(u64::from(std::process::id()), Ordering::Relaxed);
    w[2].store(buf.as_ptr() as u64, Ordering::Relaxed);
    w[0].store(2, Ordering::Release);
    spin_until(&w[0], 3);
    let mut dst = vec![0u8; MIB];
    for _ in 0..PIPE_ROUNDS {
        let mut got = 0;
        while got < MIB {
            got += pipe.try_recv(&mut dst[got..]);
        }
        send(&mut tx, &[&reply]);
    }
    std::hint::black_box(&buf);
}
