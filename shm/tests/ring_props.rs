//! Ring behaviour under random record sizes, gather splits and interleavings,
//! in one thread against a model queue and across two threads.

mod common;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{check_record, record, Region, Rng};
use ibcoll_shm::ring::{self, RingConsumer, RingProducer};
use ibcoll_shm::{Doorbell, WaitPolicy, Waiter};

/// # Safety
/// `r` was made for `capacity`, is zeroed and outlives the handles.
unsafe fn pair(r: &mut Region, capacity: usize) -> (RingProducer, RingConsumer) {
    let base = r.base();
    // SAFETY: forwarded from the caller; one handle per side.
    unsafe {
        (
            RingProducer::new(base, capacity).unwrap(),
            RingConsumer::new(base, capacity).unwrap(),
        )
    }
}

/// Splits `data` into up to four random parts, as a header + payload
/// gather would.
fn split<'a>(data: &'a [u8], rng: &mut Rng) -> Vec<&'a [u8]> {
    let mut parts = Vec::new();
    let mut rest = data;
    for _ in 0..rng.below(4) {
        let (a, b) = rest.split_at(rng.below(rest.len() + 1));
        parts.push(a);
        rest = b;
    }
    parts.push(rest);
    parts
}

#[test]
fn random_sizes_match_a_model_queue() {
    for seed in 0..40u64 {
        let mut rng = Rng::new(seed);
        let capacity = 1024 << rng.below(4);
        let mut region = Region::new(ring::region_len(capacity));
        // SAFETY: region made for `capacity`, zeroed, outlives the handles.
        let (mut p, mut c) = unsafe { pair(&mut region, capacity) };
        let max = p.max_record();
        let mut model: VecDeque<Vec<u8>> = VecDeque::new();
        for step in 0..3000u64 {
            if rng.below(3) > 0 {
                let len = match rng.below(5) {
                    0 => max,
                    1 => rng.below(max + 1),
                    _ => rng.below(200.min(max + 1)),
                };
                let data: Vec<u8> = (0..len).map(|j| (step as usize * 13 + j) as u8).collect();
                let pushed = p.try_push(&split(&data, &mut rng));
                if model.is_empty() {
                    assert!(pushed, "seed {seed}: empty ring refused {len} bytes");
                }
                if pushed {
                    model.push_back(data);
                }
            } else {
                assert_eq!(c.is_empty(), model.is_empty(), "seed {seed}");
                match c.peek() {
                    Some(rec) => {
                        assert_eq!(&rec[..], &model.pop_front().unwrap()[..], "seed {seed}");
                        rec.consume();
                    }
                    None => assert!(model.is_empty(), "seed {seed}: record lost"),
                }
            }
        }
        while let Some(want) = model.pop_front() {
            let rec = c.peek().expect("queued record missing");
            assert_eq!(&rec[..], &want[..]);
            rec.consume();
        }
        assert!(c.is_empty());
    }
}

/// Spin briefly, then block: yielding is slow when other work shares the
/// two CPUs, and these tests must stay quick on a loaded machine.
fn test_policy() -> WaitPolicy {
    WaitPolicy {
        spins: 500,
        yields: 0,
        ..WaitPolicy::default()
    }
}

#[test]
fn two_threads_stream_with_content_checks() {
    const N: u64 = 100_000;
    const MAX: usize = 4096;
    let capacity = 64 * 1024;
    let mut region = Region::new(ring::region_len(capacity));
    // SAFETY: region made for `capacity`, zeroed, outlives the scoped threads.
    let (mut p, mut c) = unsafe { pair(&mut region, capacity) };
    // Each side sleeps on its own bell; the other rings it after progress.
    let (producer_bell, consumer_bell) = (Doorbell::new(), Doorbell::new());
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut waiter = Waiter::new(test_policy());
            for i in 0..N {
                let rec = record(i, MAX);
                let (head, tail) = rec.split_at(rec.len().min(32));
                while !p.try_push(&[head, tail]) {
                    waiter.step(&producer_bell, || p.can_push(rec.len()));
                }
                waiter.reset();
                consumer_bell.ring();
            }
            done.store(true, Ordering::Release);
        });
        let mut waiter = Waiter::new(test_policy());
        let mut i = 0;
        while i < N {
            match c.peek() {
                Some(rec) => {
                    check_record(i, MAX, &rec);
                    rec.consume();
                    producer_bell.ring();
                    i += 1;
                    waiter.reset();
                }
                None => {
                    assert!(
                        !done.load(Ordering::Acquire) || !c.is_empty(),
                        "lost records"
                    );
                    waiter.step(&consumer_bell, || !c.is_empty());
                }
            }
        }
    });
    assert!(c.is_empty());
}
