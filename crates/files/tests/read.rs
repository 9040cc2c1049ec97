//! The one read of a file from a path: what it takes, what it refuses, and what its errors say.

use std::path::Path;

use egress_files::{Problem, ReadError, read_regular_file, read_regular_file_async};
use egress_testkit::ScratchDir;

/// Text no error may repeat.
const SENTINEL: &str = "contents-sentinel-5d1c";

fn refused(path: &Path, max: u64) -> ReadError {
    match read_regular_file(path, max) {
        Ok(bytes) => panic!("{} was read: {} bytes", path.display(), bytes.len()),
        Err(e) => e,
    }
}

fn shows(e: &ReadError) -> String {
    format!("{e} {e:?}")
}

#[test]
fn a_regular_file_is_read_whole_up_to_its_cap() {
    let dir = ScratchDir::new("files-read");
    let path = dir.path().join("file");
    std::fs::write(&path, "0123456789").unwrap();
    assert_eq!(read_regular_file(&path, 10).unwrap(), b"0123456789");
    assert_eq!(read_regular_file(&path, 1000).unwrap(), b"0123456789");
    std::fs::write(&path, "").unwrap();
    assert!(read_regular_file(&path, 0).unwrap().is_empty());
}

#[test]
fn a_file_over_the_cap_is_refused_naming_the_path_and_the_cap_not_the_contents() {
    let dir = ScratchDir::new("files-large");
    let path = dir.path().join("large");
    std::fs::write(&path, SENTINEL.repeat(2048)).unwrap();
    let max = 16 * 1024;
    assert!(SENTINEL.len() * 2048 > 16 * 1024);
    let e = refused(&path, max);
    assert!(matches!(e.problem, Problem::TooLarge { max: 16384 }), "{e:?}");
    assert_eq!(e.to_string(), format!("{}: larger than 16 KiB", path.display()));
    assert!(!shows(&e).contains(SENTINEL), "{}", shows(&e));
    // One byte over is over.
    std::fs::write(&path, vec![b'x'; 1025]).unwrap();
    assert!(matches!(refused(&path, 1024).problem, Problem::TooLarge { max: 1024 }));
}

/// Nothing writes to the pipe: a read that waited for a writer would hang here (nextest's
/// timeout fails it).
#[test]
fn a_pipe_does_not_hang_and_is_refused() {
    let dir = ScratchDir::new("files-fifo");
    let pipe = dir.path().join("pipe");
    egress_testkit::make_fifo(&pipe);
    let e = refused(&pipe, 1024);
    assert!(matches!(e.problem, Problem::NotRegular), "{e:?}");
    assert_eq!(e.to_string(), format!("{}: not a regular file", pipe.display()));
    // The same through a symlink: the file opened is looked at, not the link.
    let link = dir.path().join("link-to-pipe");
    std::os::unix::fs::symlink(&pipe, &link).unwrap();
    assert!(matches!(refused(&link, 1024).problem, Problem::NotRegular));
}

#[test]
fn a_directory_and_a_device_are_refused() {
    let dir = ScratchDir::new("files-dir");
    for odd in [dir.path(), Path::new("/dev/zero"), Path::new("/dev/null")] {
        let e = refused(odd, 1024);
        assert!(matches!(e.problem, Problem::NotRegular), "{}: {e:?}", odd.display());
        assert_eq!(e.path, odd);
    }
}

#[test]
fn a_symlink_to_a_regular_file_is_read() {
    let dir = ScratchDir::new("files-link");
    let (file, link) = (dir.path().join("file"), dir.path().join("link"));
    std::fs::write(&file, "through the link").unwrap();
    std::os::unix::fs::symlink(&file, &link).unwrap();
    assert_eq!(read_regular_file(&link, 1024).unwrap(), b"through the link");
}

#[test]
fn a_missing_file_says_so_and_names_the_path() {
    let dir = ScratchDir::new("files-missing");
    let missing = dir.path().join("missing");
    let e = refused(&missing, 1024);
    assert!(e.is_not_found(), "{e:?}");
    assert!(e.to_string().starts_with(&format!("{}: ", missing.display())), "{e}");
    // A dangling symlink is missing too.
    let dangling = dir.path().join("dangling");
    std::os::unix::fs::symlink(&missing, &dangling).unwrap();
    assert!(refused(&dangling, 1024).is_not_found());
    // Another problem is not.
    assert!(!refused(dir.path(), 1024).is_not_found());
}

#[test]
fn no_error_shows_the_contents() {
    let dir = ScratchDir::new("files-secret");
    let path = dir.path().join("secret");
    std::fs::write(&path, SENTINEL).unwrap();
    let unreadable = [
        refused(&path, 4),
        refused(dir.path(), 1024),
        refused(&dir.path().join("absent"), 1024),
    ];
    for e in &unreadable {
        assert!(!shows(e).contains(SENTINEL), "{}", shows(e));
        assert!(shows(e).contains(&dir.path().display().to_string()), "{}", shows(e));
    }
}

#[tokio::test]
async fn the_async_read_is_the_same_read() {
    let dir = ScratchDir::new("files-async");
    let (file, pipe) = (dir.path().join("file"), dir.path().join("pipe"));
    std::fs::write(&file, "text").unwrap();
    egress_testkit::make_fifo(&pipe);
    assert_eq!(read_regular_file_async(&file, 4).await.unwrap(), b"text");
    let e = read_regular_file_async(&file, 3).await.unwrap_err();
    assert!(matches!(e.problem, Problem::TooLarge { max: 3 }), "{e:?}");
    let e = read_regular_file_async(&pipe, 4).await.unwrap_err();
    assert!(matches!(e.problem, Problem::NotRegular), "{e:?}");
    assert_eq!(e.path, pipe);
}
