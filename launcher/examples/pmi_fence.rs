//! Benchmark body for the launcher: PMI init, one fence, finalize.

fn main() {
    let r = ibcoll_launcher::Pmi::init().and_then(|mut p| {
        p.fence()?;
        p.finalize()
    });
    if let Err(e) = r {
        eprintln!("pmi_fence: {e}");
        std::process::exit(1);
    }
}
