//! Beside the library, `mpich-abi/libmpich.so.12` (a link to
//! libibcoll_mpi.so): a program built with Debian's `mpicc.mpich` runs
//! on ibcoll with that folder first on LD_LIBRARY_PATH.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let Ok(out) = std::env::var("OUT_DIR") else {
        return;
    };
    // OUT_DIR is <target>/<profile>/build/<crate>-<hash>/out.
    let Some(profile) = std::path::Path::new(&out).ancestors().nth(3) else {
        return;
    };
    let dir = profile.join("mpich-abi");
    let _ = std::fs::create_dir_all(&dir);
    let link = dir.join("libmpich.so.12");
    let _ = std::fs::remove_file(&link);
    let _ = std::os::unix::fs::symlink("../libibcoll_mpi.so", &link);
}
