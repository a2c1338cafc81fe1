//! A collective call's stamp: what the call is, beyond its tag, in 32 bits
//! that every message of the call (`transport::header`) and every
//! shared-memory publication of it (`fastpath`) carries, so that a rank
//! whose own call disagrees with the sender's notices it from what it
//! receives anyway, without an exchange (`IBCOLL_CHECK`'s full signature
//! is `check::Sig`).
//!
//! ```text
//! bits 0..5    collective (position in Collective::ALL plus one; 0: no stamp)
//! bits 5..9    reduction operation (OPS; 0: none)
//! bits 9..13   element type of the reduction (TYPES; 0: none)
//! bits 13..32  root modulo 2^19 (rooted collectives; 0 otherwise)
//! ```
//!
//! Every field is the same on every rank of a correct call, so equal
//! stamps are all a receiver tests; it decodes both only to say which
//! field differs. Bytes per rank need no field: a message or publication
//! of another length already fails (`Disagreement::transfer`).

use crate::algorithms::Collective;
use crate::error::Disagreement;

/// Reduction operations by code (0: the collective does not reduce);
/// `ReduceOp::code` gives the code of an operation.
pub(crate) const OPS: [&str; 12] = [
    "",
    "sum",
    "prod",
    "min",
    "max",
    "band",
    "bor",
    "bxor",
    "land",
    "lor",
    "user",
    "ordered user",
];

/// Element types of reductions by code minus one (0: none).
pub(crate) const TYPES: [&str; 14] = [
    "u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64", "u128", "i128", "usize", "isize", "f32",
    "f64",
];

/// The code of the element type named `name` (a `Datatype::NAME`): its
/// position in [`TYPES`] plus one, 0 for none; a constant, so a call
/// carries one byte for it.
pub(crate) const fn type_code(name: &str) -> u8 {
    let n = name.as_bytes();
    let mut i = 0;
    while i < TYPES.len() {
        let t = TYPES[i].as_bytes();
        if t.len() == n.len() {
            let mut j = 0;
            while j < t.len() && t[j] == n[j] {
                j += 1;
            }
            if j == t.len() {
                return i as u8 + 1;
            }
        }
        i += 1;
    }
    0
}

/// The name of type code `code` ("" for none).
pub(crate) fn type_name_of(code: u8) -> &'static str {
    (code as usize)
        .checked_sub(1)
        .and_then(|i| TYPES.get(i))
        .copied()
        .unwrap_or("")
}

/// The name of operation code `code`.
pub(crate) fn op_name_of(code: u8) -> &'static str {
    OPS.get(code as usize).copied().unwrap_or("?")
}

/// Whether a collective has a root.
pub(crate) fn rooted(c: Collective) -> bool {
    c.rooted()
}

/// The stamp of a call of `coll` with `root` (ignored unless rooted),
/// reduction operation code `rop` and element type code `rty`.
#[inline(always)]
pub(crate) fn stamp(coll: Collective, root: usize, rop: u8, rty: u8) -> u32 {
    // Branch-free: every blocking collective computes it.
    let c = coll.index() as u32;
    let keep_root = ((ROOTED >> c) & 1).wrapping_neg();
    let root = ((root as u32) << 13) & keep_root;
    (c + 1) | u32::from(rop & 15) << 5 | u32::from(rty & 15) << 9 | root
}

/// Bit `i` set: `Collective::ALL[i]` has a root ([`Collective::rooted`]).
const ROOTED: u32 = {
    let mut m = 0;
    let mut i = 0;
    while i < Collective::ALL.len() {
        if Collective::ALL[i].rooted() {
            m |= 1 << i;
        }
        i += 1;
    }
    m
};

/// The collective of stamp `s` (`None` for no stamp).
pub(crate) fn collective_of(s: u32) -> Option<Collective> {
    fields(s).coll
}

/// A stamp's fields, for messages.
struct Fields {
    coll: Option<Collective>,
    rop: u8,
    rty: u8,
    root: u32,
}

fn fields(s: u32) -> Fields {
    Fields {
        coll: ((s & 31) as usize)
            .checked_sub(1)
            .and_then(|i| Collective::ALL.get(i))
            .copied(),
        rop: ((s >> 5) & 15) as u8,
        rty: ((s >> 9) & 15) as u8,
        root: s >> 13,
    }
}

/// What differs between the stamp `got` of what a rank sent and the
/// stamp `mine` of this rank's own call (`None` when they agree): the
/// first field that differs, the sender's value first. A message with no
/// stamp (0) names no collective.
#[cold]
#[inline(never)]
pub(crate) fn disagreement(got: u32, mine: u32) -> Option<Disagreement> {
    if got == mine {
        return None;
    }
    let (g, m) = (fields(got), fields(mine));
    let d = |what: &str, a: String, b: String| Disagreement {
        what: what.into(),
        a_value: a,
        b_value: b,
    };
    let coll = |c: Option<Collective>| c.map_or("no collective".into(), |c| c.name().to_string());
    Some(if g.coll != m.coll {
        d("collective", coll(g.coll), coll(m.coll))
    } else if g.root != m.root {
        d("root", g.root.to_string(), m.root.to_string())
    } else if g.rop != m.rop {
        d(
            "reduction operation",
            op_name_of(g.rop).into(),
            op_name_of(m.rop).into(),
        )
    } else {
        d(
            "element type",
            type_name_of(g.rty).into(),
            type_name_of(m.rty).into(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_calls_equal_stamps_and_each_field_is_named() {
        let s = stamp(Collective::Allreduce, 5, 1, 14);
        assert_eq!(s, stamp(Collective::Allreduce, 9, 1, 14), "unrooted");
        assert_ne!(s, 0);
        assert!(disagreement(s, s).is_none());
        let what = |a, b| disagreement(a, b).map(|d| (d.what, d.a_value, d.b_value));
        assert_eq!(
            what(
                stamp(Collective::Bcast, 0, 0, 0),
                stamp(Collective::Bcast, 1, 0, 0)
            ),
            Some(("root".into(), "0".into(), "1".into()))
        );
        assert_eq!(
            what(s, stamp(Collective::Allreduce, 0, 4, 14)),
            Some(("reduction operation".into(), "sum".into(), "max".into()))
        );
        assert_eq!(
            what(s, stamp(Collective::Allreduce, 0, 1, 13)),
            Some(("element type".into(), "f64".into(), "f32".into()))
        );
        assert_eq!(
            what(stamp(Collective::Barrier, 0, 0, 0), s),
            Some(("collective".into(), "barrier".into(), "allreduce".into()))
        );
        assert_eq!(what(0, s).map(|d| d.1), Some("no collective".into()));
    }

    #[test]
    fn every_code_fits_its_field() {
        assert!(OPS.len() <= 16 && TYPES.len() < 16);
        assert!(Collective::ALL.len() < 32);
        for (i, c) in Collective::ALL.into_iter().enumerate() {
            let s = stamp(c, (1 << 19) - 1, 11, 14);
            let f = fields(s);
            assert_eq!(f.coll, Some(c), "{i}");
            assert_eq!((f.rop, f.rty), (11, 14));
            assert_eq!(f.root, if rooted(c) { (1 << 19) - 1 } else { 0 });
        }
    }

    #[test]
    fn type_codes_round_trip() {
        for t in TYPES {
            assert_eq!(type_name_of(type_code(t)), t);
        }
        assert_eq!(type_code("f16"), 0);
        assert_eq!(type_name_of(0), "");
    }
}
