//! The exchange at the heart of a transpose, written several ways on
//! ibcoll's public API (PSTSWM's "protocols"). Each takes `send` cut into
//! `c.size()` equal blocks (block q for rank q) and fills `recv` the same
//! way (block p from rank p): an alltoall of equal blocks.

mod collective;
mod nonblocking;
mod pairwise;

use ibcoll::{Collective, Comm, Result};

/// What a protocol runs.
#[derive(Clone, Copy)]
enum How {
    /// `Comm::alltoall` with this algorithm forced (`None`: selection's).
    Alltoall(Option<&'static str>),
    Exchange(fn(&Comm, &[f64], &mut [f64]) -> Result<()>),
}

/// One protocol: its name in the tables and what it runs.
#[derive(Clone)]
pub struct Protocol {
    pub name: String,
    how: How,
}

/// Every protocol, in a fixed order (every rank builds the same list).
pub fn all() -> Vec<Protocol> {
    let ex = |name: &str, f: fn(&Comm, &[f64], &mut [f64]) -> Result<()>| Protocol {
        name: name.into(),
        how: How::Exchange(f),
    };
    let mut v = vec![Protocol {
        name: "alltoall".into(),
        how: How::Alltoall(None),
    }];
    for a in ibcoll::algorithms::algorithms(Collective::Alltoall) {
        v.push(Protocol {
            name: format!("alltoall/{}", a.name),
            how: How::Alltoall(Some(a.name)),
        });
    }
    v.extend([
        ex("ialltoall", collective::ialltoall),
        ex("alltoallv", collective::alltoallv),
        ex("sendrecv/shift", pairwise::sendrecv_shift),
        ex("sendrecv/xor", pairwise::sendrecv_xor),
        ex("send-recv/xor", pairwise::send_recv_xor),
        ex("irecv-isend/all", nonblocking::all),
        ex("irecv-isend/window2", nonblocking::window2),
        ex("irecv-ahead/send", nonblocking::recv_ahead),
    ]);
    v
}

impl Protocol {
    /// Sets up what the protocol needs for its next exchanges (a forced
    /// algorithm); [`Protocol::finish`] undoes it.
    pub fn start(&self) -> Result<()> {
        match self.how {
            How::Alltoall(alg) => ibcoll::select::force_algorithm(Collective::Alltoall, alg),
            How::Exchange(_) => Ok(()),
        }
    }

    pub fn finish(&self) -> Result<()> {
        match self.how {
            How::Alltoall(Some(_)) => ibcoll::select::force_algorithm(Collective::Alltoall, None),
            _ => Ok(()),
        }
    }

    /// One exchange on `c`.
    pub fn exchange(&self, c: &Comm, send: &[f64], recv: &mut [f64]) -> Result<()> {
        match self.how {
            How::Alltoall(_) => c.alltoall(send, recv),
            How::Exchange(f) => f(c, send, recv),
        }
    }
}

/// Tag of the point-to-point protocols' messages (each pair exchanges one
/// message per call, and calls on one communicator do not overlap).
const TAG: i32 = 20;

/// Block length of `send` on `c`, and this rank's own block copied over
/// (no protocol sends a rank its own block).
fn own_block(c: &Comm, send: &[f64], recv: &mut [f64]) -> usize {
    let (n, me) = (c.size(), c.rank());
    let b = send.len() / n;
    recv[me * b..][..b].copy_from_slice(&send[me * b..][..b]);
    b
}

/// `recv` as its `n` blocks, to be taken one at a time for receives in
/// flight.
fn blocks(recv: &mut [f64], n: usize) -> Vec<&mut [f64]> {
    let b = recv.len() / n.max(1);
    let mut v = Vec::with_capacity(n);
    let mut rest = recv;
    for _ in 0..n {
        let (h, t) = std::mem::take(&mut rest).split_at_mut(b);
        v.push(h);
        rest = t;
    }
    v
}
