//! What a program may do with nonblocking handles, checked across real
//! processes (run under ibrun, 2 or more ranks):
//!
//! - `soundness forget`: for `irecv`, `isend`, `ibcast`, `iallreduce` and
//!   `ialltoall`, eager and rendezvous sizes, the request is forgotten,
//!   leaked with `Box::leak`, or leaked in an `Rc` cycle. The scope must
//!   have finished each operation (its result is checked), and buffers the
//!   program allocates afterwards, in the freed memory, must never change
//!   while later traffic flows.
//! - `soundness panic-blocking [COUNT]` / `panic-nonblocking`: a user reduction
//!   panics inside `allreduce` / `iallreduce` on every rank; the panic is
//!   caught with `catch_unwind`, memory is intact, and every later call
//!   fails with `Error::Poisoned`.
//! - `soundness panic-scope`: the program panics with receives, sends and a
//!   collective in flight; the scope lets go of them while unwinding, and
//!   afterwards memory is intact and ibcoll still works.
//!
//! Prints `soundness <check>: ok` or exits 3 naming what went wrong.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;

use ibcoll::{Comm, Error, ReduceOp};

fn fail(c: &Comm, msg: String) -> ! {
    eprintln!("soundness rank {}: FAILED: {msg}", c.rank());
    std::process::exit(3)
}

macro_rules! ok {
    ($c:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => fail($c, format!("line {}: {e}", line!())),
        }
    };
}

/// How a handle is made to never run its destructor.
#[derive(Clone, Copy, Debug)]
enum Leak {
    Forget,
    Boxed,
    RcCycle,
}

/// A node of an `Rc` cycle that keeps a handle alive forever.
struct Cycle<H> {
    _handle: H,
    next: RefCell<Option<Rc<Cycle<H>>>>,
}

fn leak<H>(h: H, how: Leak) {
    match how {
        Leak::Forget => std::mem::forget(h),
        Leak::Boxed => {
            Box::leak(Box::new(h));
        }
        Leak::RcCycle => {
            let a = Rc::new(Cycle {
                _handle: h,
                next: RefCell::new(None),
            });
            *a.next.borrow_mut() = Some(a.clone());
        }
    }
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed * 131 + i * 7 + 1) as u8).collect()
}

/// Buffers in the memory the operation's buffers had: they must stay as
/// they were written while other traffic flows (barriers and a collective
/// of the same kind and size on fresh buffers).
fn check_fresh(c: &Comm, len: usize, what: &str) {
    let fresh: Vec<Vec<u8>> = (0..4).map(|_| vec![0x5A; len]).collect();
    for _ in 0..2 {
        ok!(c, c.barrier());
    }
    let mut x = vec![0u8; len.max(1)];
    ok!(c, c.bcast(&mut x, 0));
    ok!(c, c.allreduce_in_place(&mut x[..1], ReduceOp::Sum));
    for f in &fresh {
        if let Some(i) = f.iter().position(|&b| b != 0x5A) {
            fail(
                c,
                format!("{what}: memory freed after the scope changed at {i}"),
            );
        }
    }
}

fn forget(c: &Comm) {
    let (n, me) = (c.size(), c.rank());
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    for len in [64usize, 1 << 20] {
        for how in [Leak::Forget, Leak::Boxed, Leak::RcCycle] {
            let what = format!("{len} bytes, {how:?}");
            // Point-to-point: the receive and the send are both leaked.
            let out = pattern(me, len);
            let mut inb = vec![0u8; len];
            ibcoll::scope(|s| {
                leak(ok!(c, c.irecv(s, &mut inb, left, 3)), how);
                leak(ok!(c, c.isend(s, &out, right, 3)), how);
            });
            if inb != pattern(left, len) {
                fail(
                    c,
                    format!("irecv/isend {what}: the scope did not finish them"),
                );
            }
            drop((inb, out));
            check_fresh(c, len, &format!("irecv/isend {what}"));

            let mut b = if me == 0 {
                pattern(9, len)
            } else {
                vec![0u8; len]
            };
            ibcoll::scope(|s| leak(ok!(c, c.ibcast(s, &mut b, 0)), how));
            if b != pattern(9, len) {
                fail(c, format!("ibcast {what}: the scope did not finish it"));
            }
            drop(b);
            check_fresh(c, len, &format!("ibcast {what}"));

            let count = len / 8;
            let mine = vec![me as u64 + 1; count];
            let mut sum = vec![0u64; count];
            ibcoll::scope(|s| leak(ok!(c, c.iallreduce(s, &mine, &mut sum, ReduceOp::Sum)), how));
            let want = (n * (n + 1) / 2) as u64;
            if sum.iter().any(|&x| x != want) {
                fail(c, format!("iallreduce {what}: the scope did not finish it"));
            }
            drop((mine, sum));
            check_fresh(c, len, &format!("iallreduce {what}"));

            let block = len / n;
            let send: Vec<u8> = (0..n).flat_map(|j| pattern(me * n + j, block)).collect();
            let mut recv = vec![0u8; n * block];
            ibcoll::scope(|s| leak(ok!(c, c.ialltoall(s, &send, &mut recv)), how));
            let want: Vec<u8> = (0..n).flat_map(|j| pattern(j * n + me, block)).collect();
            if recv != want {
                fail(c, format!("ialltoall {what}: the scope did not finish it"));
            }
            drop((send, recv));
            check_fresh(c, len, &format!("ialltoall {what}"));
        }
    }
}

fn always_panics() -> ReduceOp<u64> {
    ReduceOp::user(|a: u64, b: u64| {
        if a != u64::MAX {
            panic!("user reduction refuses {a} and {b}");
        }
        a
    })
}

/// After a reduction panicked: memory intact, later calls poisoned.
fn after_panic(c: &Comm, r: std::thread::Result<ibcoll::Result<()>>, guard: &[u8], what: &str) {
    match r {
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "?".into());
            if !msg.contains("user reduction refuses") {
                fail(c, format!("{what}: unexpected panic payload {msg:?}"));
            }
        }
        Ok(res) => fail(
            c,
            format!("{what}: the panic did not reach the caller ({res:?})"),
        ),
    }
    if guard.iter().any(|&b| b != 0x33) {
        fail(c, format!("{what}: memory changed after the panic"));
    }
    match c.barrier() {
        Err(Error::Poisoned { detail, .. }) if detail.contains("panicked") => {}
        other => fail(
            c,
            format!("{what}: later call gave {other:?}, not Poisoned"),
        ),
    }
    let mut x = [1u64];
    match c.allreduce_in_place(&mut x, ReduceOp::Sum) {
        Err(Error::Poisoned { .. }) => {}
        other => fail(c, format!("{what}: later allreduce gave {other:?}")),
    }
}

/// `count` elements: 4 takes the shared-memory fast path on one node,
/// 131072 (1 MiB) a schedule with scratch, whose receives are posted when
/// the reduction panics.
fn panic_blocking(c: &Comm, count: usize) {
    let mine = vec![c.rank() as u64; count];
    let mut out = vec![0u64; count];
    let r = catch_unwind(AssertUnwindSafe(|| {
        c.allreduce(&mine, &mut out, always_panics())
    }));
    let guard = vec![0x33u8; 1 << 20];
    after_panic(c, r, &guard, "allreduce");
}

fn panic_nonblocking(c: &Comm) {
    let count = 1 << 17;
    let mine = vec![c.rank() as u64; count];
    let mut out = vec![0u64; count];
    let r = catch_unwind(AssertUnwindSafe(|| {
        ibcoll::scope(|s| c.iallreduce(s, &mine, &mut out, always_panics())?.wait())
    }));
    let guard = vec![0x33u8; 1 << 20];
    after_panic(c, r, &guard, "iallreduce");
}

fn panic_scope(c: &Comm) {
    let (n, me) = (c.size(), c.rank());
    let right = (me + 1) % n;
    let mut never = vec![0u8; 64];
    let big = pattern(me, 1 << 20);
    let mut sum = vec![0u64; 1 << 16];
    let mine = vec![1u64; 1 << 16];
    let r = catch_unwind(AssertUnwindSafe(|| {
        ibcoll::scope(|s| {
            // A receive nobody sends to, a rendezvous send whose receive
            // is never posted, and a collective in flight.
            let _a = c.irecv(s, &mut never, ibcoll::ANY_SOURCE, 77)?;
            let _b = c.isend(s, &big, right, 78)?;
            let _c = c.iallreduce(s, &mine, &mut sum, ReduceOp::Sum)?;
            panic!("the program gives up");
            #[allow(unreachable_code)]
            Ok::<(), Error>(())
        })
    }));
    if r.is_ok() {
        fail(c, "the panic was not resumed by the scope".into());
    }
    drop((never, big, sum, mine));
    let guard = vec![0x33u8; 1 << 20];
    // ibcoll still works: nothing was poisoned by the program's own panic.
    ok!(c, c.barrier());
    let mut x = [me as u64];
    ok!(c, c.allreduce_in_place(&mut x, ReduceOp::Sum));
    if x[0] != (n * (n - 1) / 2) as u64 {
        fail(c, format!("allreduce after the panic gave {}", x[0]));
    }
    check_fresh(c, 1 << 20, "after the scope's panic");
    if guard.iter().any(|&b| b != 0x33) {
        fail(c, "memory changed after the scope's panic".into());
    }
}

fn main() {
    let c = ibcoll::init().unwrap_or_else(|e| {
        eprintln!("init failed: {e}");
        std::process::exit(2)
    });
    let check = std::env::args().nth(1).unwrap_or_else(|| "forget".into());
    match check.as_str() {
        "forget" => forget(&c),
        "panic-blocking" => {
            let count = std::env::args().nth(2).and_then(|a| a.parse().ok());
            panic_blocking(&c, count.unwrap_or(1 << 17))
        }
        "panic-nonblocking" => panic_nonblocking(&c),
        "panic-scope" => panic_scope(&c),
        other => fail(&c, format!("unknown check {other}")),
    }
    if c.rank() == 0 {
        println!("soundness {check}: ok");
    }
}
