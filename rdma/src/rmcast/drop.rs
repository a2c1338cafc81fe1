//! Loss injection (`IBCOLL_MCAST_DROP_RATE`): drop that fraction of the
//! multicast packets a member receives, from a seeded generator so a failing
//! test can be replayed.

/// Decides, packet by packet, whether a received packet is dropped.
#[derive(Debug, Clone)]
pub struct DropFilter {
    /// Drop when the next 53-bit draw is below this.
    threshold: u64,
    state: u64,
    dropped: u64,
}

impl DropFilter {
    /// Drop `rate` (0.0 ..= 1.0) of the packets; `seed` picks the sequence.
    pub fn new(rate: f64, seed: u64) -> DropFilter {
        let r = if rate.is_finite() {
            rate.clamp(0.0, 1.0)
        } else {
            0.0
        };
        DropFilter {
            threshold: (r * (1u64 << 53) as f64) as u64,
            // Never zero (xorshift's fixed point).
            state: seed ^ 0x9e37_79b9_7f4a_7c15 | 1,
            dropped: 0,
        }
    }

    /// Parse an `IBCOLL_MCAST_DROP_RATE` value: a fraction in [0, 1].
    pub fn parse_rate(s: &str) -> Result<f64, String> {
        match s.trim().parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
            _ => Err(format!(
                "IBCOLL_MCAST_DROP_RATE={s:?}: expected a fraction between 0 and 1 (0.01 drops 1% of received multicast packets)"
            )),
        }
    }

    /// True: drop this packet.
    pub fn drop_next(&mut self) -> bool {
        if self.threshold == 0 {
            return false;
        }
        // xorshift64*
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        let d = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) < self.threshold;
        self.dropped += u64::from(d);
        d
    }

    /// Packets dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        let mut f = DropFilter::new(0.0, 1);
        assert!((0..10_000).all(|_| !f.drop_next()));
        let mut f = DropFilter::new(1.0, 1);
        assert!((0..10_000).all(|_| f.drop_next()));
        let mut f = DropFilter::new(0.1, 42);
        let n = (0..100_000).filter(|_| f.drop_next()).count();
        assert!((9_000..11_000).contains(&n), "{n}");
        assert_eq!(f.dropped(), n as u64);
        assert!(DropFilter::parse_rate("0.01").is_ok());
        assert!(DropFilter::parse_rate("2").is_err());
        assert!(DropFilter::parse_rate("x").is_err());
    }
}
