//! The distributed array of the transpose: N x N x N f64 on an R x C
//! process grid in pencils, the layout of a spectral transform (and of
//! 2DECOMP or P3DFFT): a z-pencil holds one x-block (of R) and one y-block
//! (of C) with every z; a transpose across the row communicator makes
//! y-pencils (every y), one across the column communicator x-pencils.

/// The part of the global array a rank holds: per dimension (x, y, z) the
/// global offset and the length; the data is row-major (z fastest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Box3 {
    pub off: [usize; 3],
    pub len: [usize; 3],
}

impl Box3 {
    pub fn count(&self) -> usize {
        self.len.iter().product()
    }

    fn strides(&self) -> [usize; 3] {
        [self.len[1] * self.len[2], self.len[2], 1]
    }

    /// The box after a swap on a communicator of `p` ranks where this
    /// rank is `me`: dimension `cut` (whole here) is cut into `p` blocks
    /// of which this rank keeps block `me`; dimension `whole` (cut here)
    /// becomes whole (`n`).
    pub fn swapped(&self, cut: usize, whole: usize, p: usize, me: usize, n: usize) -> Box3 {
        let mut b = *self;
        b.len[cut] /= p;
        b.off[cut] = me * b.len[cut];
        b.len[whole] = n;
        b.off[whole] = 0;
        b
    }
}

/// Global element (x, y, z): distinct for every element and exact in f64,
/// so a misplaced block shows as a wrong value.
pub fn value(n: usize, g: [usize; 3]) -> f64 {
    ((g[0] * n + g[1]) * n + g[2]) as f64
}

/// The reference contents of `b`.
pub fn fill(n: usize, b: &Box3, out: &mut [f64]) {
    let mut i = 0;
    for x in 0..b.len[0] {
        for y in 0..b.len[1] {
            for z in 0..b.len[2] {
                out[i] = value(n, [b.off[0] + x, b.off[1] + y, b.off[2] + z]);
                i += 1;
            }
        }
    }
}

/// The first element of `data` that differs from the reference of `b`:
/// its global index, the value wanted and the value found.
pub fn first_wrong(n: usize, b: &Box3, data: &[f64]) -> Option<([usize; 3], f64, f64)> {
    let mut i = 0;
    for x in 0..b.len[0] {
        for y in 0..b.len[1] {
            for z in 0..b.len[2] {
                let g = [b.off[0] + x, b.off[1] + y, b.off[2] + z];
                let want = value(n, g);
                if data[i].to_bits() != want.to_bits() {
                    return Some((g, want, data[i]));
                }
                i += 1;
            }
        }
    }
    None
}

/// Packs `src` (box `b`) for a swap on `p` ranks that cuts dimension
/// `cut`: block q of `send` is the part of `b` in cut-block q, row-major.
pub fn pack(src: &[f64], b: &Box3, cut: usize, p: usize, send: &mut [f64]) {
    let st = b.strides();
    let mut s = b.len;
    s[cut] /= p;
    let mut o = 0;
    for q in 0..p {
        let base = q * s[cut] * st[cut];
        for x in 0..s[0] {
            for y in 0..s[1] {
                let from = base + x * st[0] + y * st[1];
                send[o..o + s[2]].copy_from_slice(&src[from..from + s[2]]);
                o += s[2];
            }
        }
    }
}

/// Unpacks what a swap received into `dst` (box `d`, the swapped box):
/// block p of `recv` came from rank p and fills its part of dimension
/// `whole`.
pub fn unpack(recv: &[f64], d: &Box3, whole: usize, p: usize, dst: &mut [f64]) {
    let st = d.strides();
    let mut s = d.len;
    s[whole] /= p;
    let mut i = 0;
    for q in 0..p {
        let base = q * s[whole] * st[whole];
        for x in 0..s[0] {
            for y in 0..s[1] {
                let to = base + x * st[0] + y * st[1];
                dst[to..to + s[2]].copy_from_slice(&recv[i..i + s[2]]);
                i += s[2];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The swaps of a 2 x 3 grid simulated in one process: every rank's
    /// packed blocks, delivered as an alltoall would, unpack to the
    /// reference of the swapped box, and back.
    #[test]
    fn pack_exchange_unpack_is_a_transpose() {
        let (r, c, n) = (2, 3, 12);
        // Row swap (across the C ranks of a row): z is cut, y made whole.
        for i in 0..r {
            let boxes: Vec<Box3> = (0..c)
                .map(|j| Box3 {
                    off: [i * n / r, j * n / c, 0],
                    len: [n / r, n / c, n],
                })
                .collect();
            let sends: Vec<Vec<f64>> = boxes
                .iter()
                .map(|b| {
                    let mut src = vec![0.0; b.count()];
                    fill(n, b, &mut src);
                    let mut send = vec![0.0; b.count()];
                    pack(&src, b, 2, c, &mut send);
                    send
                })
                .collect();
            for (j, b) in boxes.iter().enumerate() {
                let blk = b.count() / c;
                let recv: Vec<f64> = (0..c)
                    .flat_map(|from| sends[from][j * blk..(j + 1) * blk].to_vec())
                    .collect();
                let d = b.swapped(2, 1, c, j, n);
                assert_eq!(d.len, [n / r, n, n / c]);
                let mut dst = vec![f64::NAN; d.count()];
                unpack(&recv, &d, 1, c, &mut dst);
                assert_eq!(first_wrong(n, &d, &dst), None, "row {i} rank {j}");
                // And back: the swapped box packs to what `b` unpacks.
                let mut send = vec![0.0; d.count()];
                pack(&dst, &d, 1, c, &mut send);
                assert_eq!(send.len(), b.count());
            }
        }
    }

    #[test]
    fn a_wrong_element_is_named() {
        let b = Box3 {
            off: [2, 0, 4],
            len: [1, 3, 2],
        };
        let mut d = vec![0.0; b.count()];
        fill(8, &b, &mut d);
        assert_eq!(first_wrong(8, &b, &d), None);
        d[3] = -1.0;
        assert_eq!(
            first_wrong(8, &b, &d),
            Some(([2, 1, 5], value(8, [2, 1, 5]), -1.0))
        );
    }
}
