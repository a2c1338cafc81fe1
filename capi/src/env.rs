//! Start, end, and what the environment reports.

use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;

use crate::abi::*;
use crate::buffers::put;
use crate::comm::copy_out;
use crate::error::{call, class_name, err, message, R};
use crate::requests;
use crate::state::{self, FINALIZED, PHASE, RUNNING};

fn init() -> R<()> {
    state::claim()?;
    if PHASE.load(Ordering::SeqCst) != 0 {
        return err(
            MPI_ERR_OTHER,
            "MPI_Init was called twice (or after MPI_Finalize)",
        );
    }
    let world = match ibcoll::init() {
        Ok(w) => w,
        Err(e) => {
            // No communicator yet: the error is fatal as the default
            // handler would make it.
            state::abort_job(MPI_ERR_OTHER, &format!("MPI_Init: {e}"));
        }
    };
    state::install(world);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Init(_argc: *mut c_int, _argv: *mut *mut *mut c_char) -> c_int {
    call("MPI_Init", MPI_COMM_WORLD, init)
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Init_thread(
    _argc: *mut c_int,
    _argv: *mut *mut *mut c_char,
    _required: c_int,
    provided: *mut c_int,
) -> c_int {
    call("MPI_Init_thread", MPI_COMM_WORLD, || {
        init()?;
        // Whatever was asked for, FUNNELED is what there is (a program
        // asking for more sees it here, as MPI specifies).
        put(provided, MPI_THREAD_FUNNELED, "provided")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Initialized(flag: *mut c_int) -> c_int {
    let p = PHASE.load(Ordering::SeqCst);
    call("MPI_Initialized", MPI_COMM_WORLD, || {
        put(flag, (p != 0) as c_int, "flag")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Finalized(flag: *mut c_int) -> c_int {
    let p = PHASE.load(Ordering::SeqCst);
    call("MPI_Finalized", MPI_COMM_WORLD, || {
        put(flag, (p == FINALIZED) as c_int, "flag")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Query_thread(provided: *mut c_int) -> c_int {
    call("MPI_Query_thread", MPI_COMM_WORLD, || {
        put(provided, MPI_THREAD_FUNNELED, "provided")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Is_thread_main(flag: *mut c_int) -> c_int {
    call("MPI_Is_thread_main", MPI_COMM_WORLD, || {
        put(flag, state::is_main() as c_int, "flag")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Finalize() -> c_int {
    call("MPI_Finalize", MPI_COMM_WORLD, || {
        if PHASE.load(Ordering::SeqCst) != RUNNING {
            return err(MPI_ERR_OTHER, "MPI_Finalize without MPI_Init, or twice");
        }
        let mut st = state::with(|_| Ok(()))
            .ok()
            .and_then(|_| state::take())
            .ok_or_else(|| {
                crate::error::MpiErr::new(
                    MPI_ERR_OTHER,
                    "MPI_Finalize from a thread other than the one that called MPI_Init",
                )
            })?;
        // Every rank is past its last call before any leaves: a rank's
        // exit must not look like a lost peer to one still receiving.
        let world = st.world.clone();
        requests::finish_all(&mut st);
        let b = world.barrier();
        PHASE.store(FINALIZED, Ordering::SeqCst);
        // The last communicator's drop leaves the job.
        drop(st);
        drop(world);
        b.map_err(Into::into)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Abort(comm: MPI_Comm, code: c_int) -> c_int {
    let r = state::world_rank().map_or(String::new(), |r| format!("rank {r}: "));
    state::abort_job(
        code,
        &format!("{r}MPI_Abort(communicator {comm:#x}, error code {code})"),
    )
}

#[no_mangle]
pub extern "C" fn MPI_Wtime() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

#[no_mangle]
pub extern "C" fn MPI_Wtick() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write.
    unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9).max(1e-9)
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Get_processor_name(name: *mut c_char, len: *mut c_int) -> c_int {
    call("MPI_Get_processor_name", MPI_COMM_WORLD, || {
        let mut b = [0u8; 256];
        // SAFETY: `b` is writable for its length.
        let rc = unsafe { libc::gethostname(b.as_mut_ptr() as *mut c_char, b.len()) };
        let h = if rc == 0 {
            let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            String::from_utf8_lossy(&b[..n]).into_owned()
        } else {
            "localhost".into()
        };
        copy_out(&h, name, MPI_MAX_PROCESSOR_NAME, len)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Get_version(v: *mut c_int, sub: *mut c_int) -> c_int {
    call("MPI_Get_version", MPI_COMM_WORLD, || {
        put(v, 3, "version")?;
        put(sub, 1, "subversion")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Get_library_version(s: *mut c_char, len: *mut c_int) -> c_int {
    call("MPI_Get_library_version", MPI_COMM_WORLD, || {
        let v = format!(
            "ibcoll MPI {} (MPICH ABI, MPI_THREAD_FUNNELED)",
            ibcoll::VERSION
        );
        copy_out(&v, s, 8192, len)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Error_string(code: c_int, s: *mut c_char, len: *mut c_int) -> c_int {
    call("MPI_Error_string", MPI_COMM_WORLD, || {
        let class = code & ((1 << CODE_SHIFT) - 1);
        let text = match message(code) {
            Some(m) => format!("{}: {m}", class_name(class)),
            None => class_name(class).to_string(),
        };
        copy_out(&text, s, MPI_MAX_ERROR_STRING, len)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Error_class(code: c_int, class: *mut c_int) -> c_int {
    call("MPI_Error_class", MPI_COMM_WORLD, || {
        put(class, code & ((1 << CODE_SHIFT) - 1), "errorclass")
    })
}

/// Profiling control: nothing to switch (declared variadic in `mpi.h`;
/// extra arguments are ignored).
#[no_mangle]
pub extern "C" fn MPI_Pcontrol(_level: c_int) -> c_int {
    MPI_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Alloc_mem(
    size: MPI_Aint,
    _info: MPI_Info,
    base: *mut c_void,
) -> c_int {
    call("MPI_Alloc_mem", MPI_COMM_WORLD, || {
        if size < 0 {
            return err(MPI_ERR_ARG, format!("size {size} is negative"));
        }
        // SAFETY: plain allocation; a zero size gets a unique pointer.
        let p = unsafe { libc::malloc((size as usize).max(1)) };
        if p.is_null() {
            return err(MPI_ERR_NO_MEM, format!("cannot allocate {size} bytes"));
        }
        put(base as *mut *mut c_void, p, "baseptr")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Free_mem(base: *mut c_void) -> c_int {
    // SAFETY: `base` came from MPI_Alloc_mem (MPI's contract).
    unsafe { libc::free(base) };
    MPI_SUCCESS
}

// Info objects: hints are accepted and ignored.

#[no_mangle]
pub unsafe extern "C" fn MPI_Info_create(info: *mut MPI_Info) -> c_int {
    call("MPI_Info_create", MPI_COMM_WORLD, || {
        put(info, INFO_DYN, "info")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Info_set(
    _info: MPI_Info,
    _k: *const c_char,
    _v: *const c_char,
) -> c_int {
    MPI_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Info_free(info: *mut MPI_Info) -> c_int {
    call("MPI_Info_free", MPI_COMM_WORLD, || {
        put(info, MPI_INFO_NULL, "info")
    })
}

/// Balanced factors of `nnodes` over the dimensions that are 0.
#[no_mangle]
pub unsafe extern "C" fn MPI_Dims_create(nnodes: c_int, ndims: c_int, dims: *mut c_int) -> c_int {
    call("MPI_Dims_create", MPI_COMM_WORLD, || {
        if ndims < 0 || nnodes < 1 {
            return err(MPI_ERR_ARG, format!("nnodes {nnodes}, ndims {ndims}"));
        }
        if ndims > 0 && dims.is_null() {
            return err(MPI_ERR_ARG, "dims is a null pointer");
        }
        // SAFETY: `dims` has `ndims` entries (MPI's contract).
        let d = unsafe { std::slice::from_raw_parts_mut(dims, ndims as usize) };
        let fixed: i64 = d.iter().filter(|&&x| x > 0).map(|&x| x as i64).product();
        if fixed == 0 || nnodes as i64 % fixed != 0 {
            return err(MPI_ERR_ARG, "the fixed dimensions do not divide nnodes");
        }
        let mut rest = nnodes as i64 / fixed;
        let free: Vec<usize> = (0..d.len()).filter(|&i| d[i] == 0).collect();
        let mut f = vec![1i64; free.len()];
        // Largest prime factors first, each onto the smallest dimension.
        let mut primes = Vec::new();
        let mut p = 2;
        while rest > 1 {
            while rest % p == 0 {
                primes.push(p);
                rest /= p;
            }
            p += 1;
        }
        if f.is_empty() && !primes.is_empty() {
            return err(MPI_ERR_ARG, "no free dimension for the remaining factor");
        }
        for q in primes.into_iter().rev() {
            if let Some(m) = (0..f.len()).min_by_key(|&i| f[i]) {
                f[m] *= q;
            }
        }
        f.sort_unstable_by(|a, b| b.cmp(a));
        for (k, &i) in free.iter().enumerate() {
            d[i] = f[k] as c_int;
        }
        Ok(())
    })
}
