//! Segment creation, opening, header checks, attach counting and cleanup.

mod common;

use std::path::Path;

use common::unique;
use ibcoll_shm::{
    cleanup_job, segment_name, LayoutParams, NodeLayout, NodeSegment, Segment, ShmError, SHM_DIR,
};

fn exists(name: &str) -> bool {
    Path::new(SHM_DIR).join(name).exists()
}

#[test]
fn create_is_exclusive_and_open_checks_size() {
    let name = unique("excl");
    let a = Segment::create(&name, 8192).unwrap();
    assert_eq!(a.len(), 8192);
    assert!(matches!(
        Segment::create(&name, 8192),
        Err(ShmError::Exists { .. })
    ));
    assert!(matches!(
        Segment::open(&name, 4096),
        Err(ShmError::SizeMismatch {
            expected: 4096,
            actual: 8192,
            ..
        })
    ));
    let b = Segment::open(&name, 8192).unwrap();
    // SAFETY: both mappings are 8192 bytes long and alive.
    unsafe {
        a.as_ptr().add(5000).write_volatile(42);
        assert_eq!(b.as_ptr().add(5000).read_volatile(), 42);
    }
    Segment::unlink(&name).unwrap();
    Segment::unlink(&name).unwrap();
    assert!(!exists(&name));
    // The mapping outlives the file.
    // SAFETY: `b` is still mapped.
    assert_eq!(unsafe { b.as_ptr().add(5000).read_volatile() }, 42);
    assert!(matches!(
        Segment::open(&name, 8192),
        Err(ShmError::Segment { op: "open", .. })
    ));
}

#[test]
fn node_segment_attach_and_header_validation() {
    let name = unique("node");
    let layout = NodeLayout::new(3, 4096, 100).unwrap();
    let a = NodeSegment::create(&name, layout).unwrap();
    assert!(!a.all_attached());
    let b = NodeSegment::open(&name, layout).unwrap();
    // Same total length, different ring size: the header must catch it.
    let other = NodeLayout::from_params(LayoutParams {
        ring_bytes: 2048,
        extra_bytes: 100 + 3 * 2 * 2048,
        ..*layout.params()
    })
    .unwrap();
    assert_eq!(other.total_len(), layout.total_len());
    assert!(matches!(
        NodeSegment::open(&name, other),
        Err(ShmError::BadHeader { .. })
    ));
    let c = NodeSegment::open(&name, layout).unwrap();
    assert!(a.all_attached());
    assert_eq!(c.header().attached(), 3);
    b.publish_pid(1);
    assert_eq!(a.pid(1), std::process::id() as i32);
    assert_eq!(a.pid(2), 0);
    c.unlink().unwrap();
    assert!(!exists(&name));

    // A raw segment of the right size without a header is rejected.
    let raw = unique("raw");
    let _seg = Segment::create(&raw, layout.total_len()).unwrap();
    assert!(matches!(
        NodeSegment::open(&raw, layout),
        Err(ShmError::BadHeader { .. })
    ));
    Segment::unlink(&raw).unwrap();
}

#[test]
fn rings_and_doorbells_through_a_node_segment() {
    let name = unique("rings");
    let layout = NodeLayout::new(2, 4096, 0).unwrap();
    let a = NodeSegment::create(&name, layout).unwrap();
    let b = NodeSegment::open(&name, layout).unwrap();
    a.unlink().unwrap();
    // SAFETY: one handle per ring side, all dropped before the segments.
    let (mut p01, mut c01, mut p10, mut c10) = unsafe {
        (
            a.box_producer(1, 0).unwrap(),
            b.box_consumer(1, 0).unwrap(),
            b.box_producer(0, 0).unwrap(),
            a.box_consumer(0, 0).unwrap(),
        )
    };
    assert!(p01.try_push(&[b"to one"]));
    assert!(p10.try_push(&[b"to zero"]));
    assert_eq!(&c01.peek().unwrap()[..], b"to one");
    assert_eq!(&c10.peek().unwrap()[..], b"to zero");
    assert!(!a.doorbell(1).ring());
    // SAFETY: the layout has no pipes, so this fails before touching memory.
    assert!(matches!(
        unsafe { a.pipe_sender(0) },
        Err(ShmError::Invalid(_))
    ));
}

#[test]
fn cleanup_job_removes_only_that_jobs_files() {
    let job = format!("cleanup-{}", std::process::id());
    let mine: Vec<String> = (0..3).map(|n| segment_name(&job, n)).collect();
    let sibling = segment_name(&format!("{job}-2"), 0);
    for name in mine.iter().chain([&sibling]) {
        Segment::create(name, 4096).unwrap();
    }
    assert_eq!(cleanup_job(&job).unwrap(), 3);
    for name in &mine {
        assert!(!exists(name), "{name} left behind");
    }
    assert!(exists(&sibling), "cleanup of {job} removed {sibling}");
    assert_eq!(cleanup_job(&job).unwrap(), 0);
    assert_eq!(cleanup_job(&format!("{job}-2")).unwrap(), 1);
}
