//! The namespace through its public API: canonical paths, listing, folder policies and globs.
//!
//! Spec: cluster-runtime.md "Metadata store (ACMS)" (the namespace index, `meta/ls`, folder
//! policies), "Replication" (copies wanted: the record's own replicas or its folder policy) and
//! "Map / reduce" (`metadata.Glob` with `*`, `**` and `?`); reference-facts.md "FileRecord",
//! "Policy ... default 1" and "Map/reduce: glob * ** ? (** zero folders)"; DESIGN.md "Names".

use proptest::prelude::*;
use shoal_core::hlc::Version;
use shoal_core::ids::{FileId, NodeId};
use shoal_core::meta::namespace::{
    glob, is_within, list, name, normalize, parent, policy_for, wanted_copies, ListEntry, PathError, Pattern,
    MAX_PATH_BYTES, MAX_SEGMENT_BYTES,
};
use shoal_core::meta::records::{FileRecord, Policy, Record};
use shoal_core::meta::state::MetaState;
use std::collections::{BTreeMap, BTreeSet};

// ---- helpers ----

fn version(wall_ms: u64) -> Version {
    Version { wall_ms, counter: 0, node: NodeId::new("n1") }
}

fn file(path: &str) -> FileRecord {
    FileRecord {
        id: FileId::new(format!("id:{path}")),
        path: path.to_string(),
        is_dir: false,
        size: 10,
        mod_time: 5,
        checksum: String::new(),
        owner: String::new(),
        primary: None,
        locations: Vec::new(),
        replicas: 0,
        removed: false,
        version: version(1),
        repl: None,
        based_on: None,
    }
}

fn dir(path: &str) -> FileRecord {
    FileRecord { is_dir: true, size: 0, ..file(path) }
}

fn removed(f: FileRecord) -> FileRecord {
    FileRecord { removed: true, version: version(2), ..f }
}

fn state_of(files: impl IntoIterator<Item = FileRecord>) -> MetaState {
    let mut s = MetaState::new();
    for f in files {
        s.apply(&Record::File(f));
    }
    s
}

fn policy(folder: &str, replicas: u32) -> Record {
    Record::Policy(Policy { folder: folder.to_string(), replicas, removed: false, version: version(1) })
}

fn removed_policy(folder: &str, replicas: u32) -> Record {
    Record::Policy(Policy { folder: folder.to_string(), replicas, removed: true, version: version(2) })
}

fn names(entries: &[ListEntry]) -> Vec<&str> {
    entries.iter().map(|e| e.name.as_str()).collect()
}

fn globbed(s: &MetaState, pattern: &str) -> Vec<String> {
    glob(s, pattern).unwrap_or_else(|e| panic!("glob {pattern:?}: {e}"))
}

// ---- normalize ----

/// Spec "Metadata store (ACMS)" / DESIGN.md "Names": every spelling of a path the shell may be
/// handed maps to one key, `cluster:/photos/a.jpg` included.
#[test]
fn normalize_gives_every_spelling_of_a_path_its_one_canonical_form() {
    let long_segment = "x".repeat(MAX_SEGMENT_BYTES);
    let long_ok = format!("/{long_segment}");
    let cases: &[(&str, &str)] = &[
        // The issue's three examples.
        ("cluster:photos\\x\\y", "/photos/x/y"),
        ("/a/../x", "/x"),
        ("", "/"),
        // Root spellings.
        ("/", "/"),
        ("//", "/"),
        ("\\", "/"),
        (".", "/"),
        ("cluster:", "/"),
        ("cluster:/", "/"),
        ("cluster:\\", "/"),
        ("a/..", "/"),
        ("/a/b/../..", "/"),
        // Relative paths are rooted.
        ("photos", "/photos"),
        ("./a", "/a"),
        ("b/../a", "/a"),
        // Drive prefix.
        ("cluster:/photos/a.jpg", "/photos/a.jpg"),
        ("cluster:cluster:/x", "/cluster:/x"),
        ("Cluster:/x", "/Cluster:/x"),
        ("user:/x", "/user:/x"),
        ("/cluster:/x", "/cluster:/x"),
        // Separators.
        ("/a/b/", "/a/b"),
        ("a//b///c", "/a/b/c"),
        ("\\\\server\\share\\", "/server/share"),
        ("/a\\b/c\\", "/a/b/c"),
        // Dots.
        ("/a/./b/.", "/a/b"),
        ("/a/b/../c", "/a/c"),
        ("/a/b/c/../../d/./e/", "/a/d/e"),
        ("/a/.../b", "/a/.../b"),
        ("/a/..b/c", "/a/..b/c"),
        ("/a/b./c", "/a/b./c"),
        ("/.hidden/x", "/.hidden/x"),
        // Names are kept as they are otherwise.
        ("/ spaced name /x", "/ spaced name /x"),
        ("/héllo/wörld/日本", "/héllo/wörld/日本"),
        ("/photos/*.jpg", "/photos/*.jpg"),
        ("/a:b/c?", "/a:b/c?"),
        (long_ok.as_str(), long_ok.as_str()),
    ];
    for (input, want) in cases {
        assert_eq!(normalize(input).as_deref(), Ok(*want), "normalize({input:?})");
    }
}

/// Spec "Metadata store (ACMS)": a path that cannot be a key is refused with a reason, never
/// stored, and never panics.
#[test]
fn normalize_refuses_control_characters_and_oversized_paths_with_a_reason() {
    let too_long_segment = format!("/a/{}", "x".repeat(MAX_SEGMENT_BYTES + 1));
    let removed_later = format!("/{}/..", "y".repeat(MAX_SEGMENT_BYTES + 1));
    let segment = "z".repeat(MAX_SEGMENT_BYTES);
    // 16 segments of 255 bytes with their slashes are exactly 4096 bytes; 17 are too many.
    let at_limit = format!("/{segment}").repeat(MAX_PATH_BYTES / (MAX_SEGMENT_BYTES + 1));
    let over_limit = format!("{at_limit}/{segment}");
    let cases: Vec<(&str, PathError)> = vec![
        ("/a\0b", PathError::Nul { at: 2 }),
        ("\0", PathError::Nul { at: 0 }),
        ("/a\nb", PathError::Control { code: 0x0A, at: 2 }),
        ("/a\tb", PathError::Control { code: 0x09, at: 2 }),
        ("\x7f", PathError::Control { code: 0x7F, at: 0 }),
        ("/é\u{85}", PathError::Control { code: 0x85, at: 3 }),
        ("/a/../\r", PathError::Control { code: 0x0D, at: 6 }),
        (too_long_segment.as_str(), PathError::SegmentTooLong { len: MAX_SEGMENT_BYTES + 1 }),
        (removed_later.as_str(), PathError::SegmentTooLong { len: MAX_SEGMENT_BYTES + 1 }),
        (over_limit.as_str(), PathError::TooLong { len: MAX_PATH_BYTES + MAX_SEGMENT_BYTES + 1 }),
        // Issue 17: a `..` with nothing left to remove climbs above the root: refused.
        ("/../x", PathError::AboveRoot { segment: 1 }),
        ("..", PathError::AboveRoot { segment: 0 }),
        ("a/../../x", PathError::AboveRoot { segment: 2 }),
        ("/a/b/../../..", PathError::AboveRoot { segment: 5 }),
        ("cluster:..\\etc", PathError::AboveRoot { segment: 0 }),
    ];
    for (input, want) in cases {
        assert_eq!(normalize(input), Err(want), "normalize({:?})", input.get(..40).unwrap_or(input));
    }
    assert_eq!(normalize(&at_limit).map(|p| p.len()), Ok(MAX_PATH_BYTES));
    // Only the canonical result is bounded: a long spelling of a short path is fine.
    assert_eq!(normalize(&format!("/a{}", "/.".repeat(5000))).as_deref(), Ok("/a"));

    assert_eq!(PathError::Nul { at: 2 }.to_string(), "path contains a NUL byte at byte 2");
    assert_eq!(
        PathError::Control { code: 0x0A, at: 2 }.to_string(),
        "path contains the control character U+000A at byte 2"
    );
    assert_eq!(
        PathError::SegmentTooLong { len: 300 }.to_string(),
        "path segment of 300 bytes is longer than the 255 allowed"
    );
    assert_eq!(PathError::TooLong { len: 5000 }.to_string(), "path of 5000 bytes is longer than the 4096 allowed");
}

/// Spec "Metadata store (ACMS)": the helpers the listing and policies are built on.
#[test]
fn parent_name_and_is_within_follow_whole_segments() {
    assert_eq!(parent("/"), None);
    assert_eq!(parent("/a"), Some("/"));
    assert_eq!(parent("/a/b"), Some("/a"));
    assert_eq!(parent("/a/b/c.txt"), Some("/a/b"));
    assert_eq!(parent(""), None);
    assert_eq!(parent("a"), None);

    assert_eq!(name("/"), "");
    assert_eq!(name("/a"), "a");
    assert_eq!(name("/a/b/c.txt"), "c.txt");

    let cases: &[(&str, &str, bool)] = &[
        ("/a", "/a", true),
        ("/a/b", "/a", true),
        ("/a/b/c", "/a", true),
        ("/ab", "/a", false),
        ("/ab/c", "/a", false),
        ("/a", "/a/b", false),
        ("/", "/", true),
        ("/x/y", "/", true),
        ("/a/b", "/a/", true),
        ("/b", "/a", false),
    ];
    for (path, folder, want) in cases {
        assert_eq!(is_within(path, folder), *want, "is_within({path:?}, {folder:?})");
    }
}

// ---- listing ----

/// Spec "Metadata store (ACMS)" (`meta/ls`): a folder with files below it is listed even
/// without a record of its own.
#[test]
fn listing_shows_directories_implied_by_the_files_below_them() {
    let s = state_of([
        file("/photos/2023/a.jpg"),
        file("/photos/2023/deep/b.jpg"),
        file("/photos/b.jpg"),
        file("/docs/x.txt"),
        dir("/empty"),
        file("/readme"),
    ]);
    let root = list(&s, "/").unwrap();
    assert_eq!(names(&root), ["docs", "empty", "photos", "readme"]);
    assert_eq!(
        root[0],
        ListEntry { name: "docs".into(), path: "/docs".into(), is_dir: true, size: 0, mod_time: 0, id: None }
    );
    assert_eq!(root[1].id, Some(FileId::new("id:/empty")));
    assert!(root[1].is_dir);
    assert_eq!(
        root[3],
        ListEntry {
            name: "readme".into(),
            path: "/readme".into(),
            is_dir: false,
            size: 10,
            mod_time: 5,
            id: Some(FileId::new("id:/readme")),
        }
    );

    let photos = list(&s, "/photos").unwrap();
    assert_eq!(names(&photos), ["2023", "b.jpg"]);
    assert!(photos[0].is_dir && !photos[1].is_dir);
    assert_eq!(photos[0].path, "/photos/2023");

    assert_eq!(names(&list(&s, "/photos/2023").unwrap()), ["a.jpg", "deep"]);
    assert!(list(&s, "/empty").unwrap().is_empty());
    assert!(list(&s, "/nowhere").unwrap().is_empty());
    assert!(list(&s, "/readme").unwrap().is_empty());
    assert!(list(&MetaState::new(), "/").unwrap().is_empty());
}

/// Spec "Metadata store (ACMS)"; reference weakness 7: deletions are records, and a listing
/// never shows them.
#[test]
fn listing_never_shows_tombstones() {
    let s = state_of([
        file("/a/live.txt"),
        removed(file("/a/old.txt")),
        removed(dir("/a/gone")),
        removed(file("/a/ghost/x")),
        removed(file("/a/ghost/y/z")),
        removed(dir("/a/kept")),
        file("/a/kept/y"),
    ]);
    let entries = list(&s, "/a").unwrap();
    assert_eq!(names(&entries), ["kept", "live.txt"]);
    assert!(entries[0].is_dir);
    assert_eq!(entries[0].id, None, "the removed record does not stand for the directory");
}

/// Spec "Metadata store (ACMS)": names sort by their bytes, whatever the key order of the
/// files below them (`"a b"` < `"a.txt"` < `"a/x"` as keys, `"a"` < `"a b"` as names).
#[test]
fn listing_is_sorted_by_name() {
    let s = state_of([file("/d/b"), file("/d/a/x"), file("/d/a b"), file("/d/C"), file("/d/a.txt"), file("/d/a0")]);
    assert_eq!(names(&list(&s, "/d").unwrap()), ["C", "a", "a b", "a.txt", "a0", "b"]);
}

/// Spec "Metadata store (ACMS)": a folder holds whole segments only.
#[test]
fn listing_a_folder_does_not_include_its_namesakes() {
    let s = state_of([file("/a/x"), file("/ab/y"), file("/a b/z"), file("/a.txt")]);
    assert_eq!(names(&list(&s, "/a").unwrap()), ["x"]);
    assert_eq!(names(&list(&s, "/").unwrap()), ["a", "a b", "a.txt", "ab"]);
}

/// Spec "Metadata store (ACMS)": the listed folder is normalised like any path.
#[test]
fn listing_accepts_any_spelling_of_the_folder_and_refuses_a_bad_one() {
    let s = state_of([file("/photos/a.jpg")]);
    let want = list(&s, "/photos").unwrap();
    for spelling in ["cluster:photos", "cluster:/photos/", "\\photos\\", "/x/../photos/."] {
        assert_eq!(list(&s, spelling).unwrap(), want, "{spelling:?}");
    }
    assert_eq!(list(&s, "/pho\0tos"), Err(PathError::Nul { at: 4 }));
}

/// Spec "Metadata store (ACMS)": concurrent writes of `/a/b` (a file) and `/a/b/c` leave both
/// records; the listing keeps what lies below reachable.
#[test]
fn a_file_with_live_files_below_its_name_lists_as_a_directory() {
    let s = state_of([file("/a/b"), file("/a/b/c")]);
    let entries = list(&s, "/a").unwrap();
    assert_eq!(
        entries,
        [ListEntry { name: "b".into(), path: "/a/b".into(), is_dir: true, size: 0, mod_time: 0, id: None }]
    );
}

/// Spec "Metadata store (ACMS)": `meta/ls` answers in the wire's camelCase.
#[test]
fn a_list_entry_serialises_in_camel_case() {
    let s = state_of([file("/a/f"), file("/a/d/x")]);
    let json = serde_json::to_value(list(&s, "/a").unwrap()).unwrap();
    assert_eq!(
        json,
        serde_json::json!([
            {"name": "d", "path": "/a/d", "isDir": true, "size": 0, "modTime": 0},
            {"name": "f", "path": "/a/f", "isDir": false, "size": 10, "modTime": 5, "id": "id:/a/f"},
        ])
    );
}

// ---- folder policies ----

/// Spec "Replication": the nearest folder policy decides, at the folder itself too.
#[test]
fn the_nearest_folder_policy_wins() {
    let mut s = MetaState::new();
    for p in [policy("/", 2), policy("/photos", 3), policy("/photos/raw", 5)] {
        s.apply(&p);
    }
    let cases: &[(&str, u32)] = &[
        ("/photos/raw/a.cr2", 5),
        ("/photos/raw/deep/b.cr2", 5),
        ("/photos/raw", 5),
        ("/photos/rawfiles/x", 3),
        ("/photos/a.jpg", 3),
        ("/photos", 3),
        ("/docs/x", 2),
        ("/", 2),
        ("cluster:photos\\raw\\a.cr2", 5),
    ];
    for (path, want) in cases {
        assert_eq!(policy_for(&s, path), *want, "policy_for({path:?})");
    }
}

/// Spec "Replication"; reference-facts.md "Policy ... default 1": a removed policy applies to
/// nothing, and with no policy a file wants one copy.
#[test]
fn a_removed_policy_is_ignored_and_the_default_is_one_copy() {
    let mut s = MetaState::new();
    assert_eq!(policy_for(&s, "/photos/a.jpg"), 1);
    s.apply(&policy("/docs", 4));
    assert_eq!(policy_for(&s, "/photos/a.jpg"), 1);
    assert_eq!(policy_for(&s, "/docsx/a"), 1);
    s.apply(&policy("/photos", 3));
    s.apply(&removed_policy("/photos/raw", 5));
    assert_eq!(policy_for(&s, "/photos/raw/a.cr2"), 3);
    s.apply(&removed_policy("/photos", 3));
    assert_eq!(policy_for(&s, "/photos/raw/a.cr2"), 1);
}

/// Spec "Replication": a policy never tells the planner to drop every copy.
#[test]
fn a_zero_copy_policy_still_keeps_one_copy() {
    let mut s = MetaState::new();
    s.apply(&policy("/", 3));
    s.apply(&policy("/tmp", 0));
    assert_eq!(policy_for(&s, "/tmp/x"), 1);
}

/// Spec "Replication": "the copy count its folder policy (or the record's own Replicas) asks
/// for".
#[test]
fn a_files_own_replicas_override_its_folder_policy() {
    let mut s = MetaState::new();
    s.apply(&policy("/photos", 3));
    assert_eq!(wanted_copies(&s, &file("/photos/a.jpg")), 3);
    assert_eq!(wanted_copies(&s, &FileRecord { replicas: 2, ..file("/photos/a.jpg") }), 2);
    assert_eq!(wanted_copies(&s, &FileRecord { replicas: 5, ..file("/docs/a") }), 5);
    assert_eq!(wanted_copies(&s, &file("/docs/a")), 1);
}

// ---- globs ----

fn glob_fixture() -> MetaState {
    state_of([
        file("/a/x"),
        file("/a/b/x"),
        file("/a/b/c/x"),
        file("/a/y.txt"),
        file("/a/b/y.txt"),
        file("/a/xx"),
        dir("/a/dir"),
        dir("/a/b/c/x/x"),
        removed(file("/a/gone")),
        removed(file("/a/b/gone/x")),
        file("/ab/x"),
        file("/photos/img1.jpg"),
        file("/photos/img2.jpg"),
        file("/photos/img10.jpg"),
        file("/photos/raw/img3.jpg"),
        file("/photos/é.png"),
    ])
}

/// Spec "Map / reduce": `*` stays within one segment and `?` is one character, never `/`.
#[test]
fn star_and_question_mark_match_within_one_segment() {
    let s = glob_fixture();
    assert_eq!(globbed(&s, "/a/*"), ["/a/x", "/a/xx", "/a/y.txt"]);
    assert_eq!(globbed(&s, "/a/?"), ["/a/x"]);
    assert_eq!(globbed(&s, "/a/??"), ["/a/xx"]);
    assert_eq!(globbed(&s, "/*/x"), ["/a/x", "/ab/x"]);
    assert_eq!(globbed(&s, "/a?x"), Vec::<String>::new());
    assert_eq!(globbed(&s, "/photos/img?.jpg"), ["/photos/img1.jpg", "/photos/img2.jpg"]);
    assert_eq!(globbed(&s, "/photos/img*.jpg"), ["/photos/img1.jpg", "/photos/img10.jpg", "/photos/img2.jpg"]);
    assert_eq!(globbed(&s, "/photos/*1*"), ["/photos/img1.jpg", "/photos/img10.jpg"]);
    assert_eq!(globbed(&s, "/photos/?.png"), ["/photos/é.png"]);
    assert_eq!(globbed(&s, "/photos/i**1.jpg"), ["/photos/img1.jpg"], "`**` inside a segment is two `*`");
    assert_eq!(globbed(&s, "cluster:photos\\img1*"), ["/photos/img1.jpg", "/photos/img10.jpg"]);
}

/// Spec "Map / reduce"; reference-facts.md "(** zero folders)": `**` is zero or more whole
/// folders, and a trailing `**` is everything below.
#[test]
fn double_star_matches_zero_or_more_folders() {
    let s = glob_fixture();
    assert_eq!(globbed(&s, "/a/**/x"), ["/a/b/c/x", "/a/b/x", "/a/x"]);
    assert_eq!(globbed(&s, "/a/**/**/x"), ["/a/b/c/x", "/a/b/x", "/a/x"]);
    assert_eq!(globbed(&s, "/a/**"), ["/a/b/c/x", "/a/b/x", "/a/b/y.txt", "/a/x", "/a/xx", "/a/y.txt"]);
    assert_eq!(
        globbed(&s, "/**/*.jpg"),
        ["/photos/img1.jpg", "/photos/img10.jpg", "/photos/img2.jpg", "/photos/raw/img3.jpg"]
    );
    assert_eq!(globbed(&s, "/**/b/*"), ["/a/b/x", "/a/b/y.txt"]);
    assert_eq!(globbed(&s, "/a/x/**"), Vec::<String>::new(), "a trailing ** does not match the folder itself");
    assert_eq!(globbed(&s, "/**").len(), 12);
}

/// Spec "Map / reduce": a dataset is files; folders and deleted files are not work.
#[test]
fn globs_never_return_directories_or_tombstones() {
    let s = glob_fixture();
    for pattern in ["/a/*", "/a/**", "/**", "/a/d*", "/a/g*", "/a/b/*/x", "/a/dir", "/a/gone"] {
        let got = globbed(&s, pattern);
        assert!(
            !got.iter().any(|p| p.contains("dir") || p.contains("gone") || p == "/a/b/c/x/x"),
            "{pattern}: {got:?}"
        );
    }
}

/// Spec "Map / reduce": a pattern without wildcards names one file.
#[test]
fn a_pattern_without_wildcards_is_that_file_or_nothing() {
    let s = glob_fixture();
    assert_eq!(globbed(&s, "/a/x"), ["/a/x"]);
    assert_eq!(globbed(&s, "cluster:a\\b\\..\\x"), ["/a/x"]);
    assert_eq!(globbed(&s, "/a/nothing"), Vec::<String>::new());
    assert_eq!(globbed(&s, "/a/dir"), Vec::<String>::new());
    assert_eq!(globbed(&s, "/a/gone"), Vec::<String>::new());
    assert_eq!(globbed(&s, "/a"), Vec::<String>::new());
}

/// Spec "Map / reduce": a bad dataset pattern is refused, not expanded.
#[test]
fn a_pattern_that_is_not_a_path_is_refused() {
    let s = glob_fixture();
    assert_eq!(glob(&s, "/a/*\0"), Err(PathError::Nul { at: 4 }));
    assert!(matches!(glob(&s, &format!("/{}*", "x".repeat(300))), Err(PathError::SegmentTooLong { .. })));
}

/// Spec "Map / reduce": only the subtree named by the pattern's literal prefix is scanned.
#[test]
fn the_literal_prefix_of_a_pattern_bounds_the_scan() {
    let cases: &[(&str, &str)] = &[
        ("/a/b/*.jpg", "/a/b/"),
        ("/a/img*", "/a/img"),
        ("/a/img?x/*", "/a/img"),
        ("/a/**/x", "/a/"),
        ("/**", "/"),
        ("/*", "/"),
        ("/x*", "/x"),
        ("/a/b", "/a/b"),
    ];
    for (pattern, want) in cases {
        assert_eq!(Pattern::parse(pattern).unwrap().literal_prefix(), *want, "{pattern}");
    }
    let p = Pattern::parse("cluster:a\\*").unwrap();
    assert_eq!(p.as_str(), "/a/*");
    assert!(!p.is_literal());
    assert!(Pattern::parse("/a/b").unwrap().is_literal());
}

// ---- properties ----

/// Path-like strings: separators, dots, the drive prefix, odd and multibyte characters.
fn path_like() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("/".to_string()),
            Just("\\".to_string()),
            Just(".".to_string()),
            Just("..".to_string()),
            Just("cluster:".to_string()),
            Just("a".to_string()),
            Just("bc".to_string()),
            Just("é".to_string()),
            Just(" ".to_string()),
            Just("*".to_string()),
            "[a-z]{1,4}",
        ],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

/// Canonical paths over a small alphabet, so that files share folders and names, with names
/// that sort just before and just after `name/` (`a b`, `a.b`, `a0` around `a/`).
fn small_path() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(vec!["a", "b", "ab", "ba", "a b", "a.b", "a0", "x.jpg", "é"]), 1..5)
        .prop_map(|segs| format!("/{}", segs.join("/")))
}

/// Patterns over the same alphabet with every kind of wildcard.
fn small_pattern() -> impl Strategy<Value = Vec<&'static str>> {
    prop::collection::vec(
        prop::sample::select(vec!["a", "b", "ab", "x.jpg", "*", "?", "a*", "*b", "?b", "**", "*.jpg", "x.*", "?*?"]),
        1..5,
    )
}

fn join(segs: &[&str]) -> String {
    format!("/{}", segs.join("/"))
}

/// A namespace of files, folders and tombstones at the generated paths.
fn namespace() -> impl Strategy<Value = MetaState> {
    prop::collection::vec((small_path(), 0u8..10), 0..40).prop_map(|entries| {
        state_of(entries.into_iter().map(|(path, kind)| match kind {
            0 => dir(&path),
            1 => removed(file(&path)),
            2 => removed(dir(&path)),
            _ => file(&path),
        }))
    })
}

/// A matcher written the slow, obvious way: recursion over segments and characters.
fn naive_matches(pattern: &[&str], names: &[&str]) -> bool {
    fn seg(p: &[char], s: &[char]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some(('*', rest)) => (0..=s.len()).any(|k| seg(rest, &s[k..])),
            Some(('?', rest)) => !s.is_empty() && seg(rest, &s[1..]),
            Some((c, rest)) => s.first() == Some(c) && seg(rest, &s[1..]),
        }
    }
    match pattern.split_first() {
        None => names.is_empty(),
        Some((&"**", [])) => !names.is_empty(),
        Some((&"**", rest)) => (0..=names.len()).any(|k| naive_matches(rest, &names[k..])),
        Some((p, rest)) => match names.split_first() {
            Some((n, tail)) => {
                let (p, n): (Vec<char>, Vec<char>) = (p.chars().collect(), n.chars().collect());
                seg(&p, &n) && naive_matches(rest, tail)
            }
            None => false,
        },
    }
}

fn live_files(s: &MetaState) -> impl Iterator<Item = &FileRecord> {
    s.files().filter(|f| !f.removed && !f.is_dir)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Spec "Metadata store (ACMS)": any string, even arbitrary Unicode, gets an answer.
    #[test]
    fn normalize_never_panics_on_any_string(s in any::<String>()) {
        let _ = normalize(&s);
    }

    /// Spec "Metadata store (ACMS)": the canonical form is a fixed point and has the canonical
    /// shape, so one file has one key.
    #[test]
    fn normalize_is_idempotent_and_its_output_is_canonical(s in prop_oneof![path_like(), any::<String>()]) {
        if let Ok(out) = normalize(&s) {
            prop_assert_eq!(normalize(&out), Ok(out.clone()));
            prop_assert!(out.starts_with('/'), "{:?}", out);
            prop_assert!(!out.contains("//") && !out.contains("/./") && !out.contains("/../"), "{:?}", out);
            prop_assert!(!out.contains('\\'), "{:?}", out);
            prop_assert!(out == "/" || !out.ends_with('/'), "{:?}", out);
            prop_assert!(!out.ends_with("/.") && !out.ends_with("/.."), "{:?}", out);
            prop_assert!(out.len() <= MAX_PATH_BYTES);
            prop_assert!(out.split('/').all(|seg| seg.len() <= MAX_SEGMENT_BYTES));
        }
    }

    /// Spec "Metadata store (ACMS)": the listing found by seeking past each child folder is the
    /// listing a full scan of the namespace gives.
    #[test]
    fn listing_equals_a_full_scan(s in namespace(), folder in prop_oneof![Just("/".to_string()), small_path()]) {
        let prefix = if folder == "/" { "/".to_string() } else { format!("{folder}/") };
        let mut want: BTreeMap<String, (String, bool)> = BTreeMap::new();
        for f in s.files().filter(|f| !f.removed && f.path.starts_with(&prefix)) {
            let rest = &f.path[prefix.len()..];
            let child = rest.split('/').next().unwrap_or(rest).to_string();
            let below = rest.contains('/');
            let entry = want.entry(child.clone()).or_insert((format!("{prefix}{child}"), false));
            entry.1 |= below || f.is_dir;
        }
        let got: BTreeMap<String, (String, bool)> =
            list(&s, &folder).unwrap().into_iter().map(|e| (e.name, (e.path, e.is_dir))).collect();
        prop_assert_eq!(got, want);
    }

    /// Spec "Map / reduce": the hand-written matcher agrees with the obvious recursive one.
    #[test]
    fn the_glob_matcher_agrees_with_a_naive_one(pattern in small_pattern(), path in small_path()) {
        let names: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let parsed = Pattern::parse(&join(&pattern)).unwrap();
        prop_assert_eq!(parsed.matches(&path), naive_matches(&pattern, &names));
    }

    /// Spec "Map / reduce": scanning only the literal prefix's range loses nothing; the result
    /// is every live file the pattern matches, sorted.
    #[test]
    fn glob_equals_a_full_scan_filtered_by_the_pattern(s in namespace(), pattern in small_pattern()) {
        let pattern = join(&pattern);
        let parsed = Pattern::parse(&pattern).unwrap();
        let want: Vec<String> = live_files(&s).filter(|f| parsed.matches(&f.path)).map(|f| f.path.clone()).collect();
        let got = glob(&s, &pattern).unwrap();
        let mut sorted = got.clone();
        sorted.sort();
        prop_assert_eq!(&got, &sorted);
        prop_assert_eq!(got, want);
    }

    /// Spec "Map / reduce": a pattern with no wildcard returns exactly that file if it exists.
    #[test]
    fn a_literal_pattern_returns_exactly_that_file(s in namespace(), path in small_path()) {
        let exists = s.file(&path).is_some_and(|f| !f.removed && !f.is_dir);
        let got = glob(&s, &path).unwrap();
        prop_assert_eq!(got, if exists { vec![path] } else { Vec::new() });
    }

    /// Spec "Map / reduce": `**` in the place of a `*` segment matches at least as much.
    #[test]
    fn double_star_matches_a_superset_of_star_at_the_same_position(
        s in namespace(),
        pattern in small_pattern(),
        at in any::<prop::sample::Index>(),
    ) {
        let mut star = pattern.clone();
        let i = at.index(star.len());
        star[i] = "*";
        let mut double = star.clone();
        double[i] = "**";
        let narrow: BTreeSet<String> = glob(&s, &join(&star)).unwrap().into_iter().collect();
        let wide: BTreeSet<String> = glob(&s, &join(&double)).unwrap().into_iter().collect();
        prop_assert!(narrow.is_subset(&wide), "{:?} ⊄ {:?}", narrow, wide);
    }
}
