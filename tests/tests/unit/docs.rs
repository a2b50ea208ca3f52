//! The project's documents, checked: every `docs/<page>.md#<section>` the
//! code cites, and every link between the Markdown pages, leads to a page
//! and a heading that exist.

use std::{
    fs,
    path::{Path, PathBuf},
};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where code lives: every crate of the workspace, and the fuzz targets.
const CODE_DIRS: [&str; 7] = ["agent", "common", "ebpf", "lab", "xtask", "tests", "fuzz"];

/// Every file under `dir` whose name ends in `.{ext}`, build output aside.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() && name != "target" && name != "corpus" {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == ext) {
                found.push(path);
            }
        }
    }
    found
}

/// The anchor GitHub gives a heading: lower case, spaces as hyphens, and
/// no punctuation but hyphens and underscores.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings, code blocks aside.
fn anchors(markdown: &str) -> Vec<String> {
    let mut in_code = false;
    let mut found = Vec::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            found.push(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

/// The documents: every page of `docs/`, and the README.
fn pages() -> Vec<PathBuf> {
    let root = workspace();
    let mut pages = files(&root.join("docs"), "md");
    pages.push(root.join("README.md"));
    pages
}

/// Whether `page#section` exists; `page` is a path from the workspace.
fn exists(page: &Path, section: &str) -> Result<(), String> {
    let text = fs::read_to_string(workspace().join(page))
        .map_err(|e| format!("{}: {e}", page.display()))?;
    if section.is_empty() || anchors(&text).iter().any(|a| a == section) {
        Ok(())
    } else {
        Err(format!("{} has no section #{section}", page.display()))
    }
}

/// The `docs/<page>.md#<section>` citations in `text`.
fn citations(text: &str) -> Vec<(String, String)> {
    text.match_indices("docs/")
        .filter_map(|(at, _)| {
            let rest = &text[at..];
            let (page, after) = rest.split_once(".md#")?;
            if page.contains(|c: char| !(c.is_alphanumeric() || "/_-".contains(c))) {
                return None;
            }
            let section: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '-' | '_'))
                .collect();
            Some((format!("{page}.md"), section))
        })
        .collect()
}

/// The targets of the relative links `](target)` in a Markdown text, split
/// into page and section, with web addresses and images' own files aside.
fn links(markdown: &str) -> Vec<(String, String)> {
    markdown
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target))
        .filter(|t| !t.contains("://") && !t.to_ascii_lowercase().ends_with(".png"))
        .map(|t| {
            let (page, section) = t.split_once('#').unwrap_or((t, ""));
            (page.to_owned(), section.to_owned())
        })
        .collect()
}

#[test]
fn every_section_the_code_cites_exists() {
    let root = workspace();
    let mut broken = Vec::new();
    let mut cited = 0;
    for dir in CODE_DIRS {
        for file in files(&root.join(dir), "rs") {
            for (page, section) in citations(&fs::read_to_string(&file).unwrap()) {
                cited += 1;
                if let Err(e) = exists(Path::new(&page), &section) {
                    broken.push(format!("{}: {e}", file.display()));
                }
            }
        }
    }
    assert!(
        cited > 10,
        "only {cited} citations found: is the scan broken?"
    );
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn every_link_between_the_documents_leads_somewhere() {
    let root = workspace();
    let mut broken = Vec::new();
    for page in pages() {
        let text = fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap().strip_prefix(&root).unwrap();
        for (target, section) in links(&text) {
            let target = if target.is_empty() {
                page.strip_prefix(&root).unwrap().to_owned()
            } else {
                dir.join(&target)
            };
            if let Err(e) = exists(&target, &section) {
                broken.push(format!("{}: {e}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn headings_get_the_anchors_github_gives_them() {
    assert_eq!(anchor(" The lab's variants"), "the-labs-variants");
    assert_eq!(
        anchor("Pins, restarts and upgrades"),
        "pins-restarts-and-upgrades"
    );
    assert_eq!(
        citations("see docs/design.md#expected-reachability, row 5"),
        [(
            "docs/design.md".to_owned(),
            "expected-reachability".to_owned()
        )]
    );
    assert_eq!(
        links("[a](operating.md#translation) [b](#top) [c](https://x.io/y.md)"),
        [
            ("operating.md".to_owned(), "translation".to_owned()),
            (String::new(), "top".to_owned())
        ]
    );
}

/// Where a reader meets the project's words besides the code: the
/// documents, the manifests and the CI script.
const OTHER_READ_DIRS: [&str; 3] = ["docs", "manifests", ".ci"];

/// The places in `text` that cite an entry of the tracker by number
/// ("issue" or "issues", a space, an optional `#`, digits), which no
/// reader outside the tracker can resolve.
fn tracker_numbers(text: &str) -> Vec<String> {
    let lower = text.to_lowercase();
    lower
        .match_indices("issue")
        .filter_map(|(at, _)| {
            let rest = &lower[at + "issue".len()..];
            let rest = rest.strip_prefix('s').unwrap_or(rest);
            let rest = rest.strip_prefix(' ')?;
            let rest = rest.strip_prefix('#').unwrap_or(rest);
            rest.starts_with(|c: char| c.is_ascii_digit())
                .then(|| lower[at..].chars().take(24).collect())
        })
        .collect()
}

#[test]
fn nothing_cites_a_tracker_number() {
    let root = workspace();
    let mut found = Vec::new();
    let mut read = 0;
    let files_read = CODE_DIRS
        .iter()
        .chain(&OTHER_READ_DIRS)
        .flat_map(|dir| ["rs", "md", "yaml", "toml", "sh"].map(|ext| files(&root.join(dir), ext)))
        .flatten()
        .chain([
            root.join("README.md"),
            root.join("Cargo.toml"),
            root.join(".ci/run"),
        ]);
    for page in files_read {
        read += 1;
        for cited in tracker_numbers(&fs::read_to_string(&page).unwrap()) {
            found.push(format!("{}: {cited}", page.display()));
        }
    }
    assert!(read > 100, "only {read} files read: is the scan broken?");
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn a_tracker_number_is_found_in_each_spelling() {
    for number in ["18", "#18"] {
        for word in ["issue", "Issue", "issues", "Issues"] {
            let text = format!("as {word} {number} says");
            assert_eq!(tracker_numbers(&text).len(), 1, "{text}");
        }
    }
    for text in ["an issue with 18 peers", "issues: 18", "tissue"] {
        assert!(tracker_numbers(text).is_empty(), "{text}");
    }
}

/// The most words a sentence of the documents may average, page by page.
const MEAN_WORDS: f64 = 22.0;
/// The most words any one sentence of the documents may have.
const MOST_WORDS: usize = 60;

/// The prose of a Markdown page, sentence by sentence, each as its words.
///
/// Code blocks, tables, headings and HTML are not prose. A list item starts
/// a sentence of its own. A code span counts as one word, and a link as
/// its text. A sentence ends at `.`, `!` or `?` before white space.
fn sentences(markdown: &str) -> Vec<Vec<String>> {
    let mut units: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut in_code = false;
    let close = |current: &mut String, units: &mut Vec<String>| {
        if !current.trim().is_empty() {
            units.push(std::mem::take(current));
        }
        current.clear();
    };
    for line in markdown.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_code = !in_code;
            close(&mut current, &mut units);
            continue;
        }
        let not_prose = ['|', '#', '<', '!'].iter().any(|c| trimmed.starts_with(*c));
        if in_code || not_prose || trimmed.is_empty() {
            close(&mut current, &mut units);
            continue;
        }
        if let Some(item) = list_item(trimmed) {
            close(&mut current, &mut units);
            current.push_str(item);
        } else {
            current.push(' ');
            current.push_str(trimmed);
        }
    }
    close(&mut current, &mut units);
    units
        .iter()
        .flat_map(|unit| split_sentences(&plain(unit)))
        .collect()
}

/// The text of a list item's first line, if `line` starts one.
fn list_item(line: &str) -> Option<&str> {
    let bullet = ["- ", "* ", "+ "].iter().find_map(|b| line.strip_prefix(b));
    let numbered = line
        .split_once(". ")
        .filter(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        .map(|(_, rest)| rest);
    bullet.or(numbered)
}

/// `text` with each code span made one word and each link its text.
fn plain(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(['`', '[', ']']) {
        out.push_str(&rest[..at]);
        let (mark, after) = rest[at..].split_at(1);
        rest = match mark {
            "`" => match after.split_once('`') {
                Some((_, after)) => {
                    out.push_str("CODE");
                    after
                }
                None => after,
            },
            "]" => match after.strip_prefix('(').and_then(|a| a.split_once(')')) {
                Some((_, after)) => after,
                None => after,
            },
            _ => after,
        };
    }
    out.push_str(rest);
    out
}

/// `text` cut into sentences, each as its words.
fn split_sentences(text: &str) -> Vec<Vec<String>> {
    let mut sentences = Vec::new();
    let mut words = Vec::new();
    for word in text.split_whitespace() {
        words.push(word.to_owned());
        if word.ends_with(['.', '!', '?']) {
            sentences.push(std::mem::take(&mut words));
        }
    }
    if !words.is_empty() {
        sentences.push(words);
    }
    sentences
}

#[test]
fn the_documents_speak_in_plain_sentences() {
    let root = workspace();
    let mut problems = Vec::new();
    let mut stats = Vec::new();
    for page in pages() {
        let sentences = sentences(&fs::read_to_string(&page).unwrap());
        let name = page.strip_prefix(&root).unwrap().display().to_string();
        let words: usize = sentences.iter().map(Vec::len).sum();
        let mean = words as f64 / sentences.len().max(1) as f64;
        let longest = sentences.iter().map(Vec::len).max().unwrap_or(0);
        stats.push(format!(
            "{name}: {} sentences, {mean:.1} words on average, {longest} at most",
            sentences.len()
        ));
        if mean > MEAN_WORDS {
            problems.push(format!("{name}: {mean:.1} words a sentence on average"));
        }
        for sentence in sentences.iter().filter(|s| s.len() > MOST_WORDS) {
            let start: Vec<&str> = sentence.iter().take(12).map(String::as_str).collect();
            problems.push(format!(
                "{name}: a sentence of {} words: {} …",
                sentence.len(),
                start.join(" ")
            ));
        }
    }
    println!("{}", stats.join("\n"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn sentences_are_cut_as_a_reader_reads_them() {
    let page = "# Title\n\nOne `a b c` two. Three [four five](x.md#y)\nsix!\n\n\
                - an item\n  goes on.\n- another\n\n| a | table |\n\n```\ncode. here.\n```\n";
    let words: Vec<usize> = sentences(page).iter().map(Vec::len).collect();
    assert_eq!(words, [3, 4, 4, 1]);
}

#[test]
fn the_packet_path_picture_is_drawn_from_its_source_and_names_every_program() {
    use sha2::{Digest, Sha256};
    let docs = workspace().join("docs");
    let source = fs::read(docs.join("packet-path.dot")).unwrap();
    let svg = fs::read_to_string(docs.join("packet-path.svg")).unwrap();
    let hash: String = Sha256::digest(&source)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        svg.contains(&format!("sha256 {hash}")),
        "docs/packet-path.svg was drawn from another docs/packet-path.dot: run `cargo xtask docs`"
    );
    let programs = isthmus_common::names::tc_programs()
        .chain([isthmus_common::names::PROG_GUARD])
        // The picture shows the lab's tun and veths, with Liqo v0.10 peers.
        .filter(|p| !p.ends_with("_eth") && !p.starts_with("peer_"));
    for program in programs {
        assert!(svg.contains(program), "the picture does not show {program}");
    }
}
