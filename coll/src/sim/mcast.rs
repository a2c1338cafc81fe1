//! The multicast broadcast among node leaders in the α-β model (it is not a
//! schedule of sends and receives, so the simulator cannot run it): one
//! root injection that the switch replicates, the window's ack rounds, the
//! final acks up the binomial ack tree (each call completes synchronously,
//! `crate::mcast`), and repairs for injected loss. Compared with the
//! simulated node-aware tree in `sim/tests.rs` (`mcast_model_table`).

use super::Model;

/// Protocol parameters of the model.
#[derive(Debug, Clone, Copy)]
pub struct McastParams {
    /// Path MTU (a fragment carries `mtu - 32` bytes).
    pub mtu: usize,
    /// Fragments the root holds unacknowledged.
    pub window: usize,
    /// Root's cost per datagram posted (s): the work request, the copy
    /// into the window.
    pub per_packet: f64,
    /// Fraction of the packets each leader loses.
    pub loss: f64,
    /// Quiet time before a receiver nacks the tail (s).
    pub nack_delay: f64,
}

impl Default for McastParams {
    fn default() -> McastParams {
        McastParams {
            mtu: 4096,
            window: 64,
            per_packet: 0.2e-6,
            loss: 0.0,
            nack_delay: 200e-6,
        }
    }
}

/// Seconds for the leaders' phase of a multicast broadcast of `bytes` among
/// `k` node leaders (add the in-node phases before and after).
pub fn leaders_time(m: &Model, p: &McastParams, k: usize, bytes: usize) -> f64 {
    if k < 2 || bytes == 0 {
        return 0.0;
    }
    let payload = (p.mtu - 32) as f64;
    let nfrags = (bytes as f64 / payload).ceil();
    let depth = (k as f64).log2().ceil();
    let a = m.inter_alpha;
    let wire = |frags: f64| frags * (p.mtu as f64 * m.inter_beta + p.per_packet);
    // The stream at line rate, or the window's ack rounds if those are
    // slower: every `window` fragments wait for data + acks up the tree.
    let stream = a + wire(nfrags);
    let rounds = (nfrags / p.window as f64).floor() * (depth + 1.0) * a;
    let mut t = stream.max(rounds);
    if p.loss > 0.0 {
        // Fragments some leader lost, resent once each (suppression); the
        // last ones are found by the quiet-time nack (tail) or a gap.
        let lost_somewhere = nfrags * (1.0 - (1.0 - p.loss).powf((k - 1) as f64));
        t += wire(lost_somewhere);
        if lost_somewhere > 0.0 {
            t += 2.0 * a + p.nack_delay * (1.0 - (1.0 - p.loss).powf((k - 1) as f64));
        }
    }
    // The final acks climb the tree before the root returns.
    t + depth * a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape() {
        let m = Model::cluster();
        let p = McastParams::default();
        // Independent of the leader count but for the ack tree's depth.
        let t8 = leaders_time(&m, &p, 8, 1 << 20);
        let t1024 = leaders_time(&m, &p, 1024, 1 << 20);
        assert!(t1024 > t8 && t1024 - t8 < 20.0 * m.inter_alpha);
        // Loss costs more.
        let lossy = McastParams { loss: 0.01, ..p };
        assert!(leaders_time(&m, &lossy, 64, 1 << 20) > leaders_time(&m, &p, 64, 1 << 20));
        assert_eq!(leaders_time(&m, &p, 1, 100), 0.0);
    }
}
