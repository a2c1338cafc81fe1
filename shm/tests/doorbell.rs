//! Doorbell wake-ups across threads: with spinning and yielding disabled
//! every wait blocks, and a lost wake-up would show as a timed-out block.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ibcoll_shm::{Doorbell, WaitPolicy, WaitStep, Waiter};

/// Long enough that only a lost wake-up can reach it.
const BLOCK: Duration = Duration::from_secs(20);

fn block_only() -> WaitPolicy {
    WaitPolicy {
        spins: 0,
        yields: 0,
        block_timeout: BLOCK,
    }
}

/// Waits until `word >= target`, returning how many blocks timed out.
fn wait_for(word: &AtomicU64, target: u64, bell: &Doorbell) -> u32 {
    let mut waiter = Waiter::new(block_only());
    let mut timeouts = 0;
    while word.load(Ordering::Acquire) < target {
        if waiter.step(bell, || word.load(Ordering::Acquire) >= target) == WaitStep::TimedOut {
            timeouts += 1;
        }
    }
    timeouts
}

#[test]
fn ping_pong_never_loses_a_wakeup() {
    const ROUNDS: u64 = 10_000;
    let (ping, pong) = (AtomicU64::new(0), AtomicU64::new(0));
    let (bell_a, bell_b) = (Doorbell::new(), Doorbell::new());
    let timeouts = std::thread::scope(|s| {
        let b = s.spawn(|| {
            let mut t = 0;
            for r in 1..=ROUNDS {
                t += wait_for(&ping, r, &bell_b);
                pong.store(r, Ordering::Release);
                bell_a.ring();
            }
            t
        });
        let mut t = 0;
        for r in 1..=ROUNDS {
            ping.store(r, Ordering::Release);
            bell_b.ring();
            t += wait_for(&pong, r, &bell_a);
        }
        t + b.join().unwrap()
    });
    assert_eq!(timeouts, 0);
}

#[test]
fn many_ringers_one_sleeper() {
    const RINGERS: u64 = 3;
    const EACH: u64 = 5_000;
    let count = AtomicU64::new(0);
    let bell = Doorbell::new();
    let timeouts = std::thread::scope(|s| {
        for _ in 0..RINGERS {
            s.spawn(|| {
                for _ in 0..EACH {
                    count.fetch_add(1, Ordering::Release);
                    bell.ring();
                }
            });
        }
        // Waiting for just the next increment makes the sleeper block and
        // re-arm many times while the ringers race it.
        let mut timeouts = 0;
        loop {
            let seen = count.load(Ordering::Acquire);
            if seen == RINGERS * EACH {
                break;
            }
            timeouts += wait_for(&count, seen + 1, &bell);
        }
        timeouts
    });
    assert_eq!(timeouts, 0);
}
