//! The compiler wrappers `ibcoll-mpicc` and `ibcoll-mpicxx`: the C or C++
//! compiler with `mpi.h`'s folder and libibcoll_mpi added, like `mpicc`.
//!
//! The compiler is `cc`/`c++`, or `$IBCOLL_MPICC_CC` / `$IBCOLL_MPICXX_CXX`.
//! The library is the one beside this executable (target/release or
//! target/debug), linked with an rpath so the program runs without
//! LD_LIBRARY_PATH. `-show` prints the command instead of running it;
//! `-static-ibcoll` links the static archive instead.

use std::path::PathBuf;
use std::process::Command;

pub fn run(compiler_env: &str, default: &str) -> ! {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("."));
    let libdir = exe
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let include = std::env::var("IBCOLL_MPI_INCLUDE")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/include").to_string());
    let cc = std::env::var(compiler_env).unwrap_or_else(|_| default.to_string());
    let mut show = false;
    let mut static_lib = false;
    let mut link = true;
    let mut args = Vec::new();
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "-show" | "-showme" => show = true,
            "-static-ibcoll" => static_lib = true,
            "-c" | "-E" | "-S" | "-M" | "-MM" => {
                link = false;
                args.push(a);
            }
            _ => args.push(a),
        }
    }
    let mut full = vec![format!("-I{include}")];
    full.extend(args);
    if link {
        let d = libdir.display();
        if static_lib {
            full.push(format!("{d}/libibcoll_mpi.a"));
            // What `rustc --print native-static-libs` lists for the archive.
            for l in [
                "-libverbs",
                "-lrdmacm",
                "-lgcc_s",
                "-lutil",
                "-lrt",
                "-lpthread",
                "-lm",
                "-ldl",
                "-lc",
            ] {
                full.push(l.into());
            }
        } else {
            full.push(format!("-L{d}"));
            full.push(format!("-Wl,-rpath,{d}"));
            full.push("-libcoll_mpi".into());
        }
    }
    if show {
        println!("{cc} {}", full.join(" "));
        std::process::exit(0);
    }
    match Command::new(&cc).args(&full).status() {
        Ok(s) => std::process::exit(s.code().unwrap_or(1)),
        Err(e) => {
            eprintln!("ibcoll-mpicc: cannot run {cc}: {e}");
            std::process::exit(127)
        }
    }
}
