//! The reducing collectives on untyped bytes, for interfaces that learn
//! the element type only at run time (the MPI C interface in `capi/`): the
//! caller gives the element size and the reduction as a [`ByteReduce`]
//! (a built-in one from [`crate::ops::byte_reduce`], or its own from
//! [`ByteReduce::from_fn`]). The collectives that only move data need no
//! such form: they take `u8` buffers with counts in bytes.
//!
//! Buffers are whole elements (`len` a multiple of `esize`); counts are in
//! elements. Everything else is as in the typed calls.

use super::{prefix, CollRequest, Collective, Comm, Result, Scope};
use crate::ops::ByteReduce;

impl Comm {
    fn check_raw(&self, c: Collective, esize: usize, bufs: &[usize]) -> Result<()> {
        if esize == 0 {
            return Err(self.coll_err(c, "element size 0".into()));
        }
        if let Some(l) = bufs.iter().find(|&&l| l % esize != 0) {
            return Err(self.coll_err(
                c,
                format!("a buffer of {l} bytes is not a whole number of {esize}-byte elements"),
            ));
        }
        Ok(())
    }

    /// [`Comm::reduce`] on bytes; `send` `None` is in place (`recv` holds
    /// the input).
    pub fn reduce_raw(
        &self,
        send: Option<&[u8]>,
        recv: &mut [u8],
        esize: usize,
        op: &ByteReduce,
        root: usize,
    ) -> Result<()> {
        let c = Collective::Reduce;
        self.check_root(c, root)?;
        self.check_raw(c, esize, &[send.map_or(0, |s| s.len()), recv.len()])?;
        self.block(self.reduce_like_bytes(c, send, recv, esize, (op.clone(), op.codes()), root))
    }

    /// [`Comm::allreduce`] on bytes; `send` `None` is in place.
    pub fn allreduce_raw(
        &self,
        send: Option<&[u8]>,
        recv: &mut [u8],
        esize: usize,
        op: &ByteReduce,
    ) -> Result<()> {
        let c = Collective::Allreduce;
        self.check_raw(c, esize, &[send.map_or(0, |s| s.len()), recv.len()])?;
        self.block(self.reduce_like_bytes(c, send, recv, esize, (op.clone(), op.codes()), 0))
    }

    /// [`Comm::scan`] (or with `exclusive`, [`Comm::exscan`]) on bytes;
    /// `send` `None` is in place.
    pub fn scan_raw(
        &self,
        exclusive: bool,
        send: Option<&[u8]>,
        recv: &mut [u8],
        esize: usize,
        op: &ByteReduce,
    ) -> Result<()> {
        let c = if exclusive {
            Collective::Exscan
        } else {
            Collective::Scan
        };
        self.check_raw(c, esize, &[send.map_or(0, |s| s.len()), recv.len()])?;
        self.block(self.reduce_like_bytes(c, send, recv, esize, (op.clone(), op.codes()), 0))
    }

    /// [`Comm::reduce_scatter`] on bytes (`counts` per rank, in elements);
    /// `send` `None` is in place. `counts` `None` is
    /// [`Comm::reduce_scatter_block`] with `recv` one block long (never in
    /// place).
    pub fn reduce_scatter_raw(
        &self,
        send: Option<&[u8]>,
        recv: &mut [u8],
        counts: Option<&[usize]>,
        esize: usize,
        op: &ByteReduce,
    ) -> Result<()> {
        let (c, counts) = match counts {
            Some(k) => (Collective::ReduceScatter, Some((k, prefix(k)))),
            None => (Collective::ReduceScatterBlock, None),
        };
        self.check_raw(c, esize, &[send.map_or(0, |s| s.len()), recv.len()])?;
        if counts.is_none() && send.is_none() {
            return Err(self.coll_err(c, "reduce_scatter_block has no in-place form".into()));
        }
        let k = counts.as_ref().map(|(k, d)| (*k, &d[..]));
        self.block(self.reduce_scatter_bytes(c, send, recv, esize, k, (op.clone(), op.codes())))
    }

    /// Nonblocking [`Comm::reduce_raw`].
    pub fn ireduce_raw<'s>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: Option<&'s [u8]>,
        recv: &'s mut [u8],
        esize: usize,
        op: &ByteReduce,
        root: usize,
    ) -> Result<CollRequest<'s>> {
        let c = Collective::Reduce;
        self.check_root(c, root)?;
        self.check_raw(c, esize, &[send.map_or(0, |s| s.len()), recv.len()])?;
        self.nonblock(
            scope,
            self.reduce_like_bytes(c, send, recv, esize, (op.clone(), op.codes()), root),
        )
    }

    /// Nonblocking [`Comm::allreduce_raw`].
    pub fn iallreduce_raw<'s>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: Option<&'s [u8]>,
        recv: &'s mut [u8],
        esize: usize,
        op: &ByteReduce,
    ) -> Result<CollRequest<'s>> {
        let c = Collective::Allreduce;
        self.check_raw(c, esize, &[send.map_or(0, |s| s.len()), recv.len()])?;
        self.nonblock(
            scope,
            self.reduce_like_bytes(c, send, recv, esize, (op.clone(), op.codes()), 0),
        )
    }

    /// Nonblocking [`Comm::scan_raw`].
    pub fn iscan_raw<'s>(
        &self,
        scope: &'s Scope<'s, '_>,
        exclusive: bool,
        send: Option<&'s [u8]>,
        recv: &'s mut [u8],
        esize: usize,
        op: &ByteReduce,
    ) -> Result<CollRequest<'s>> {
        let c = if exclusive {
            Collective::Exscan
        } else {
            Collective::Scan
        };
        self.check_raw(c, esize, &[send.map_or(0, |s| s.len()), recv.len()])?;
        self.nonblock(
            scope,
            self.reduce_like_bytes(c, send, recv, esize, (op.clone(), op.codes()), 0),
        )
    }

    /// Nonblocking [`Comm::reduce_scatter_raw`].
    pub fn ireduce_scatter_raw<'s>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: Option<&'s [u8]>,
        recv: &'s mut [u8],
        counts: Option<&[usize]>,
        esize: usize,
        op: &ByteReduce,
    ) -> Result<CollRequest<'s>> {
        let (c, counts) = match counts {
            Some(k) => (Collective::ReduceScatter, Some((k, prefix(k)))),
            None => (Collective::ReduceScatterBlock, None),
        };
        self.check_raw(c, esize, &[send.map_or(0, |s| s.len()), recv.len()])?;
        if counts.is_none() && send.is_none() {
            return Err(self.coll_err(c, "reduce_scatter_block has no in-place form".into()));
        }
        let k = counts.as_ref().map(|(k, d)| (*k, &d[..]));
        self.nonblock(
            scope,
            self.reduce_scatter_bytes(c, send, recv, esize, k, (op.clone(), op.codes())),
        )
    }
}
