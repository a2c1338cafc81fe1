//! Receives posted before the data arrives, in a scope.

use ibcoll::{Comm, Result};

use super::{blocks, own_block, TAG};

/// Every receive posted, then every send started, then one wait for all.
pub fn all(c: &Comm, send: &[f64], recv: &mut [f64]) -> Result<()> {
    window(c, send, recv, usize::MAX)
}

/// [`all`] over two steps at a time: fewer messages in flight (less
/// memory for unexpected data and rendezvous state), a wait per window.
pub fn window2(c: &Comm, send: &[f64], recv: &mut [f64]) -> Result<()> {
    window(c, send, recv, 2)
}

fn window(c: &Comm, send: &[f64], recv: &mut [f64], w: usize) -> Result<()> {
    let (n, me) = (c.size(), c.rank());
    let b = own_block(c, send, recv);
    let mut bl = blocks(recv, n);
    let mut k = 1;
    while k < n {
        let end = k.saturating_add(w).min(n);
        ibcoll::scope(|s| {
            let mut reqs = Vec::with_capacity(2 * (end - k));
            for step in k..end {
                let from = (me + n - step) % n;
                reqs.push(c.irecv(s, std::mem::take(&mut bl[from]), from, TAG)?);
            }
            for step in k..end {
                let to = (me + step) % n;
                reqs.push(c.isend(s, &send[to * b..][..b], to, TAG)?);
            }
            ibcoll::wait_all(reqs).map(drop)
        })?;
        k = end;
    }
    Ok(())
}

/// Shift order with blocking sends, each step's receive posted one step
/// ahead: the message of step k always finds its receive waiting (no
/// unexpected-message copy), with at most two receives in flight.
pub fn recv_ahead(c: &Comm, send: &[f64], recv: &mut [f64]) -> Result<()> {
    let (n, me) = (c.size(), c.rank());
    let b = own_block(c, send, recv);
    if n < 2 {
        return Ok(());
    }
    let mut bl = blocks(recv, n);
    ibcoll::scope(|s| {
        let from = |k: usize| (me + n - k) % n;
        let mut ahead = Some(c.irecv(s, std::mem::take(&mut bl[from(1)]), from(1), TAG)?);
        for k in 1..n {
            let next = if k + 1 < n {
                let f = from(k + 1);
                Some(c.irecv(s, std::mem::take(&mut bl[f]), f, TAG)?)
            } else {
                None
            };
            let to = (me + k) % n;
            c.send(&send[to * b..][..b], to, TAG)?;
            if let Some(r) = ahead.take() {
                r.wait()?;
            }
            ahead = next;
        }
        Ok(())
    })
}
