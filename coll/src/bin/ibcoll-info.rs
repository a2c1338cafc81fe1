//! Prints ibcoll's version, transports, the CMA probe result, and every
//! configuration variable with its default, current value and doc.

const USAGE: &str = "\
usage: ibcoll-info [options]

Prints ibcoll's version, its transports and whether rdma and single-copy
shared memory (CMA) work here, checks the IBCOLL_* variables of the
environment, and lists every variable with its default and current value.

options:
  -h, --help     this text
  -V, --version  print the version
";

fn main() {
    // Three flags do not need an argument parser; anything else is an
    // error, so a mistyped flag is not silently ignored.
    if let Some(a) = std::env::args().nth(1) {
        match a.as_str() {
            "-h" | "--help" => print!("{USAGE}"),
            "-V" | "--version" => println!("ibcoll-info (ibcoll) {}", ibcoll::VERSION),
            _ => {
                eprintln!("ibcoll-info: unknown option {a:?} (see ibcoll-info --help)");
                std::process::exit(2);
            }
        }
        return;
    }
    println!("ibcoll {}", ibcoll::VERSION);
    let (cma, why) = ibcoll::cma_status();
    println!(
        "transports: self, shm (same node), rdma (other nodes, verbs), tcp (other nodes, fallback)"
    );
    let (rdma, what) = ibcoll::rdma_status();
    println!(
        "rdma: {} ({what})",
        if rdma {
            "available"
        } else {
            "unavailable, tcp between nodes"
        }
    );
    println!(
        "shm single copy (CMA): {} ({why})",
        if cma {
            "available"
        } else {
            "unavailable, pipelined copy used"
        }
    );
    match ibcoll::tcp_address_status() {
        Ok((addrs, why)) => println!("tcp: publishes {addrs} ({why})"),
        Err(e) => println!("tcp: no address to publish: {e}"),
    }
    match ibcoll::config::Config::from_env() {
        Ok(_) => println!("configuration: valid"),
        Err(e) => println!("configuration: INVALID: {e}"),
    }
    println!();
    println!(
        "{:<24} {:<16} {:<16} description",
        "variable", "default", "current"
    );
    for e in ibcoll::config::REGISTRY {
        let cur = std::env::var(e.name).unwrap_or_else(|_| "-".into());
        println!("{:<24} {:<16} {:<16} {}", e.name, e.default, cur, e.doc);
    }
}
