//! The pieces the MPI C interface uses, on a singleton job (one process,
//! no launcher): byte-level reductions with a kernel of the caller's,
//! cancelling an unmatched receive, and the one-rank communicator.
//! Multi-rank coverage is `scripts/capi-test` (C programs through ibrun).

use ibcoll::ops::{byte_reduce, ByteReduce};
use ibcoll::{static_scope, ReduceOp};

#[test]
fn raw_reductions_cancel_and_self_comm() {
    let world = ibcoll::init().expect("singleton init");

    // A built-in kernel on bytes: same as the typed call.
    let send: Vec<u8> = [1.5f64, 2.0].iter().flat_map(|x| x.to_ne_bytes()).collect();
    let mut recv = vec![0u8; 16];
    let k = byte_reduce::<f64>(ReduceOp::Sum);
    world.allreduce_raw(Some(&send), &mut recv, 8, &k).unwrap();
    assert_eq!(recv, send);

    // A caller's kernel on 16-byte items (a value and an index).
    let pair = ByteReduce::from_fn(|dst, src, _| {
        for (d, s) in dst.chunks_exact_mut(16).zip(src.chunks_exact(16)) {
            if s[0] < d[0] {
                d.copy_from_slice(s);
            }
        }
    });
    let mut inplace = vec![7u8; 32];
    world.allreduce_raw(None, &mut inplace, 16, &pair).unwrap();
    assert_eq!(inplace, vec![7u8; 32]);
    let mut out = vec![0u8; 32];
    world
        .scan_raw(false, Some(&[3u8; 32]), &mut out, 16, &pair)
        .unwrap();
    assert_eq!(out, vec![3u8; 32]);

    // Bad element sizes are errors naming the collective.
    let e = world
        .allreduce_raw(Some(&[0u8; 10]), &mut [0u8; 10], 4, &k)
        .unwrap_err();
    assert!(e.to_string().contains("allreduce"), "{e}");
    let e = world.reduce_raw(None, &mut [0u8; 8], 0, &k, 0).unwrap_err();
    assert!(e.to_string().contains("element size 0"), "{e}");
    let e = world
        .reduce_scatter_raw(None, &mut [0u8; 8], None, 8, &k)
        .unwrap_err();
    assert!(e.to_string().contains("in-place"), "{e}");

    // Cancel: an unmatched receive is withdrawn and nothing lands later.
    let buf: &'static mut [u8] = Box::leak(vec![0u8; 8].into_boxed_slice());
    let ptr = buf.as_ptr();
    let mut r = world.irecv(static_scope(), buf, 0, 5).unwrap();
    assert!(r.cancel());
    assert!(!r.cancel());
    world.send(&[9u8; 8], 0, 5).unwrap();
    let mut other = [0u8; 8];
    let st = world.recv(&mut other, 0, 5).unwrap();
    assert_eq!((other, st.len), ([9u8; 8], 8));
    // SAFETY: the leaked buffer lives forever; the cancelled receive no
    // longer refers to it.
    assert_eq!(unsafe { std::slice::from_raw_parts(ptr, 8) }, &[0u8; 8]);
    // A matched receive cannot be cancelled.
    world.send(&[1u8; 4], 0, 6).unwrap();
    let b2: &'static mut [u8] = Box::leak(vec![0u8; 4].into_boxed_slice());
    let mut r2 = world.irecv(static_scope(), b2, 0, 6).unwrap();
    assert!(!r2.cancel());
    assert_eq!(r2.test().unwrap().map(|s| s.len), Some(4));

    // The one-rank communicator: its own context, messages to itself.
    let me = world.self_comm();
    assert_eq!((me.rank(), me.size()), (0, 1));
    me.send(&[4u32], 0, 1).unwrap();
    assert!(
        world.iprobe(0, 1).unwrap().is_none(),
        "contexts are separate"
    );
    let mut x = [0u32];
    me.recv(&mut x, 0, 1).unwrap();
    assert_eq!(x, [4]);
    let mut s = [0u32];
    me.allreduce(&[5u32], &mut s, ReduceOp::Sum).unwrap();
    assert_eq!(s, [5]);
    let d = world.dup().unwrap();
    assert_eq!(d.size(), 1);
}
