//! Collective signatures (`IBCOLL_CHECK=1`): what one rank passed to a
//! collective call, as a fixed-size record the ranks of the communicator
//! allgather before the call, and the verdict every rank reaches from the
//! same records (so every rank fails the call with the same
//! [`Error::Mismatch`], naming the same two ranks).
//!
//! MPI leaves a program whose ranks disagree undefined; MPICH's
//! error-checking builds and Open MPI's coll/sync do the same exchange.

use crate::algorithms::Collective;
use crate::error::{Disagreement, Error, Op};
use crate::ops::ReduceOp;

/// Bytes of one record.
pub(crate) const RECORD: usize = 64;

use crate::stamp::rooted;
#[cfg(test)]
use crate::stamp::OPS;
pub(crate) use crate::stamp::{type_code, type_name_of};

/// The code of `op` (`stamp::OPS`).
#[inline]
pub(crate) fn op_code<T>(op: &ReduceOp<T>) -> u8 {
    op.code()
}

/// One rank's signature of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sig {
    pub coll: Collective,
    pub call: u64,
    /// Started by a nonblocking call (which never matches a blocking one:
    /// on one node the blocking form takes the shared-memory fast path).
    pub nb: bool,
    pub root: u64,
    /// Bytes of this rank's own block (count times element size).
    pub bytes: u64,
    /// Reduction operation code (0: none).
    pub rop: u8,
    /// Element type of a reduction (empty otherwise), at most 8 bytes.
    pub rty: [u8; 8],
    /// Hash of the per-rank block sizes (bytes) this rank was given, when
    /// it was given them (v-collectives).
    pub layout: Option<u64>,
}

/// FNV-1a over the byte sizes of the blocks.
pub(crate) fn layout_hash(counts: &[usize], esize: usize) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &c in counts {
        for b in ((c * esize) as u64).to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

impl Sig {
    pub fn encode(&self) -> [u8; RECORD] {
        let mut r = [0u8; RECORD];
        r[0] = self.coll.index() as u8;
        r[1] = self.rop;
        r[2] = u8::from(self.layout.is_some());
        r[3] = u8::from(self.nb);
        r[8..16].copy_from_slice(&self.call.to_le_bytes());
        r[16..24].copy_from_slice(&self.root.to_le_bytes());
        r[24..32].copy_from_slice(&self.bytes.to_le_bytes());
        r[32..40].copy_from_slice(&self.rty);
        r[40..48].copy_from_slice(&self.layout.unwrap_or(0).to_le_bytes());
        r
    }

    pub fn decode(r: &[u8]) -> Option<Sig> {
        let u = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().unwrap_or_default());
        Some(Sig {
            coll: *Collective::ALL.get(r[0] as usize)?,
            rop: r[1],
            call: u(8),
            nb: r[3] != 0,
            root: u(16),
            bytes: u(24),
            rty: r[32..40].try_into().ok()?,
            layout: (r[2] != 0).then(|| u(40)),
        })
    }

    pub fn type_name(&self) -> String {
        let end = self.rty.iter().position(|&b| b == 0).unwrap_or(8);
        String::from_utf8_lossy(&self.rty[..end]).into_owned()
    }
}

/// The element type's name as stored in a record.
pub(crate) fn type_field(name: &str) -> [u8; 8] {
    let mut t = [0u8; 8];
    let n = name.len().min(8);
    t[..n].copy_from_slice(&name.as_bytes()[..n]);
    t
}

/// Whether every rank's own block must have the same size.
fn uniform(c: Collective) -> bool {
    !matches!(
        c,
        Collective::Barrier
            | Collective::Gatherv
            | Collective::Scatterv
            | Collective::Allgatherv
            | Collective::Alltoallv
            | Collective::ReduceScatter
    )
}

/// The outcome of looking at every rank's record.
pub(crate) enum Verdict {
    Agree,
    /// A disagreement found from the records alone.
    Mismatch(Error),
    /// Some rank's per-rank sizes do not hash to the blocks the ranks
    /// passed: a second exchange finds which entry (see
    /// [`layout_detail`]).
    Layout,
}

/// Looks at the records of every rank (`group[i]` is rank i's world rank;
/// `me` this process's world rank, `op` the collective it called). The
/// reference is the root's record for rooted collectives, rank 0's else.
pub(crate) fn verify(recs: &[Sig], group: &[usize], me: usize, op: Op) -> Verdict {
    let mm = |what: &str, a: usize, av: String, b: usize, bv: String| {
        Verdict::Mismatch(Error::Mismatch {
            rank: me,
            op,
            call: recs[a].call,
            a: group[a],
            b: group[b],
            values: Box::new(Disagreement {
                what: what.to_string(),
                a_value: av,
                b_value: bv,
            }),
        })
    };
    let r0 = &recs[0];
    if let Some(b) = recs.iter().position(|r| r.coll != r0.coll) {
        return mm(
            "collective",
            0,
            r0.coll.name().into(),
            b,
            recs[b].coll.name().into(),
        );
    }
    if let Some(b) = recs.iter().position(|r| r.call != r0.call) {
        return mm(
            "call number",
            0,
            r0.call.to_string(),
            b,
            recs[b].call.to_string(),
        );
    }
    if let Some(b) = recs.iter().position(|r| r.nb != r0.nb) {
        let form = |nb: bool| if nb { "nonblocking" } else { "blocking" }.to_string();
        return mm("form", 0, form(r0.nb), b, form(recs[b].nb));
    }
    let c = r0.coll;
    let mut refr = 0;
    if rooted(c) {
        if let Some(b) = recs.iter().position(|r| r.root != r0.root) {
            return mm("root", 0, r0.root.to_string(), b, recs[b].root.to_string());
        }
        refr = (r0.root as usize).min(recs.len() - 1);
    }
    let rr = &recs[refr];
    if let Some(b) = recs.iter().position(|r| r.rop != rr.rop) {
        let name = |x: u8| crate::stamp::op_name_of(x).to_string();
        return mm(
            "reduction operation",
            refr,
            name(rr.rop),
            b,
            name(recs[b].rop),
        );
    }
    if let Some(b) = recs.iter().position(|r| r.rty != rr.rty) {
        return mm("element type", refr, rr.type_name(), b, recs[b].type_name());
    }
    if uniform(c) {
        if let Some(b) = recs.iter().position(|r| r.bytes != rr.bytes) {
            return mm(
                "bytes per rank",
                refr,
                rr.bytes.to_string(),
                b,
                recs[b].bytes.to_string(),
            );
        }
    }
    let owns: Vec<usize> = recs.iter().map(|r| r.bytes as usize).collect();
    let h = layout_hash(&owns, 1);
    if recs.iter().any(|r| r.layout.is_some_and(|l| l != h)) {
        return Verdict::Layout;
    }
    Verdict::Agree
}

/// This rank's first per-rank size (bytes) that differs from what that rank
/// passed: `(index, this rank's value)`, or `None`.
pub(crate) fn layout_detail(counts: &[usize], esize: usize, owns: &[u64]) -> Option<(u64, u64)> {
    counts
        .iter()
        .zip(owns)
        .position(|(&c, &o)| (c * esize) as u64 != o)
        .map(|i| (i as u64, (counts[i] * esize) as u64))
}

/// The error from the second exchange: `details[a]` is rank a's first
/// disagreeing entry.
pub(crate) fn layout_error(
    details: &[Option<(u64, u64)>],
    owns: &[u64],
    call: u64,
    group: &[usize],
    me: usize,
    op: Op,
) -> Option<Error> {
    let a = details.iter().position(Option::is_some)?;
    let (i, v) = details[a]?;
    let i = i as usize;
    Some(Error::Mismatch {
        rank: me,
        op,
        call,
        a: group[a],
        b: group[i],
        values: Box::new(Disagreement {
            what: format!("bytes in the block of (communicator) rank {i}"),
            a_value: v.to_string(),
            b_value: owns[i].to_string(),
        }),
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn op_codes_name_their_ops() {
        let user = ReduceOp::<u64>::user(|a, b| a ^ b);
        for op in [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Band,
            ReduceOp::Bor,
            ReduceOp::Bxor,
            ReduceOp::Land,
            ReduceOp::Lor,
            user,
            ReduceOp::<u64>::ordered(|a, b| a ^ b),
        ] {
            assert_eq!(OPS[op_code(&op) as usize], op.name());
        }
    }

    use super::*;

    fn sig(coll: Collective, root: u64, bytes: u64) -> Sig {
        Sig {
            coll,
            call: 3,
            nb: false,
            root,
            bytes,
            rop: 0,
            rty: [0; 8],
            layout: None,
        }
    }

    #[test]
    fn records_round_trip() {
        let mut s = sig(Collective::Allreduce, 0, 32);
        s.rop = op_code(&ReduceOp::<f64>::Max);
        s.rty = type_field("f64");
        s.layout = Some(7);
        assert_eq!(Sig::decode(&s.encode()), Some(s.clone()));
        assert_eq!(s.type_name(), "f64");
    }

    #[test]
    fn every_rank_names_the_same_pair() {
        let g = [10, 11, 12];
        let recs = [
            sig(Collective::Allreduce, 0, 32),
            sig(Collective::Allreduce, 0, 800_000),
            sig(Collective::Allreduce, 0, 800_000),
        ];
        let Verdict::Mismatch(e) = verify(&recs, &g, 12, Op::Collective(Collective::Allreduce))
        else {
            panic!("no mismatch")
        };
        let t = e.to_string();
        assert!(t.contains("rank 10 has bytes per rank 32"), "{t}");
        assert!(t.contains("rank 11 has bytes per rank 800000"), "{t}");
        assert_eq!(e.peer(), Some(10));
    }

    #[test]
    fn roots_and_layouts() {
        let g = [0, 1];
        let recs = [sig(Collective::Bcast, 0, 8), sig(Collective::Bcast, 1, 8)];
        assert!(matches!(
            verify(&recs, &g, 0, Op::Barrier),
            Verdict::Mismatch(Error::Mismatch { .. })
        ));
        let mut a = sig(Collective::Gatherv, 0, 8);
        a.layout = Some(layout_hash(&[1, 2], 8));
        let b = sig(Collective::Gatherv, 0, 8);
        assert!(matches!(
            verify(&[a, b], &g, 0, Op::Barrier),
            Verdict::Layout
        ));
        assert_eq!(layout_detail(&[1, 2], 8, &[8, 8]), Some((1, 16)));
        let mut ok = sig(Collective::Gatherv, 0, 8);
        ok.layout = Some(layout_hash(&[1, 1], 8));
        let b = sig(Collective::Gatherv, 0, 8);
        assert!(matches!(
            verify(&[ok, b], &g, 0, Op::Barrier),
            Verdict::Agree
        ));
    }
}
