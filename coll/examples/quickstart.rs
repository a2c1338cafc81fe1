//! The example from README.md (kept compiling and run by the tests).

use ibcoll::{ReduceOp, ANY_SOURCE, ANY_TAG};

fn main() -> ibcoll::Result<()> {
    let world = ibcoll::init()?; // under ibrun, srun, mpiexec, or alone
    let (rank, size) = (world.rank(), world.size());
    if rank == 0 && size > 1 {
        world.send(&[1.0f64, 2.0], 1, 7)?; // typed buffers of any primitive type
    } else if rank == 1 {
        let mut buf = [0.0f64; 2];
        let st = world.recv(&mut buf, ANY_SOURCE, ANY_TAG)?;
        assert_eq!((st.source, st.tag), (0, 7));
    }
    let mut sum = [0u64];
    world.allreduce(&[rank as u64], &mut sum, ReduceOp::Sum)?;
    // Nonblocking calls run in a scope: their buffers stay borrowed until it
    // ends, and it finishes whatever is still outstanding then, so no request
    // (waited for, dropped, forgotten or leaked) can outlive its buffers.
    let mut neighbour = [0u64];
    ibcoll::scope(|s| {
        let left = (rank + size - 1) % size;
        let r = world.irecv(s, &mut neighbour, left, 0)?;
        world.send(&[rank as u64], (rank + 1) % size, 0)?;
        let b = world.ibcast(s, &mut sum, 0)?; // nonblocking collectives too
        r.wait()?;
        b.wait()
    })?;
    assert_eq!(neighbour[0] as usize, (rank + size - 1) % size);
    Ok(())
}
