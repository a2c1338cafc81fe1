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
    let req = world.ibcast(&mut sum, 0)?; // nonblocking collectives return requests
    req.wait()?;
    Ok(())
}
