//! One partner at a time: n-1 steps, each a send and a receive.

use ibcoll::{Comm, Result};

use super::{own_block, TAG};

/// Step k sends to me+k and receives from me-k: every rank sends and
/// receives once per step, along a shift.
pub fn sendrecv_shift(c: &Comm, send: &[f64], recv: &mut [f64]) -> Result<()> {
    let (n, me) = (c.size(), c.rank());
    let b = own_block(c, send, recv);
    for k in 1..n {
        let (to, from) = ((me + k) % n, (me + n - k) % n);
        c.sendrecv(
            &send[to * b..][..b],
            to,
            TAG,
            &mut recv[from * b..][..b],
            from,
            TAG,
        )?;
    }
    Ok(())
}

/// Partners of step k in XOR order (me ^ k; steps whose partner is past
/// the last rank are skipped): each step pairs ranks, so a step's two
/// messages travel between the same two ranks.
fn xor_partners(n: usize, me: usize) -> impl Iterator<Item = usize> {
    (1..n.next_power_of_two())
        .map(move |k| me ^ k)
        .filter(move |&p| p < n)
}

pub fn sendrecv_xor(c: &Comm, send: &[f64], recv: &mut [f64]) -> Result<()> {
    let b = own_block(c, send, recv);
    for p in xor_partners(c.size(), c.rank()) {
        c.sendrecv(&send[p * b..][..b], p, TAG, &mut recv[p * b..][..b], p, TAG)?;
    }
    Ok(())
}

/// Blocking `send` and `recv` only, in XOR order: the lower rank of each
/// pair sends first, the higher receives first, so no step waits on a
/// send that nobody receives (a large send blocks until it is received).
pub fn send_recv_xor(c: &Comm, send: &[f64], recv: &mut [f64]) -> Result<()> {
    let me = c.rank();
    let b = own_block(c, send, recv);
    for p in xor_partners(c.size(), me) {
        let (out, inc) = (&send[p * b..][..b], &mut recv[p * b..][..b]);
        if me < p {
            c.send(out, p, TAG)?;
            c.recv(inc, p, TAG)?;
        } else {
            c.recv(inc, p, TAG)?;
            c.send(out, p, TAG)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::xor_partners;

    #[test]
    fn xor_order_pairs_every_rank_once() {
        for n in 1..=9 {
            for me in 0..n {
                let mut v: Vec<usize> = xor_partners(n, me).collect();
                // Symmetric: my k-th partner has me as its partner at the same k.
                for p in &v {
                    assert!(xor_partners(n, *p).any(|q| q == me));
                }
                v.push(me);
                v.sort();
                assert_eq!(v, (0..n).collect::<Vec<_>>(), "n {n} me {me}");
            }
        }
    }
}
