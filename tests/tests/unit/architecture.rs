//! The shape of the code, checked: the import graph of every crate in the
//! workspace has no cycle between files, the agent's layers import only
//! downwards, and no file of any crate outgrows a reader.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// The agent's layers, lowest first: each may use only those before it.
const LAYERS: [&str; 8] = [
    "sync", "model", "kernel", "tunnel", "roles", "observe", "control", "commands",
];
/// The longest a Rust file of any crate may be, in lines.
const LONGEST_FILE: usize = 600;
/// The longest `main.rs` may be: argument parsing and one call.
const LONGEST_MAIN: usize = 150;
/// The most entries at the top of `agent/src`.
const MOST_TOP_ENTRIES: usize = 10;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One crate's module tree: module path → file, from its root file; with
/// its test modules or without.
fn modules(root: &Path, with_tests: bool) -> BTreeMap<Vec<String>, PathBuf> {
    let mut found = BTreeMap::new();
    let mut pending = vec![(Vec::new(), root.to_owned())];
    while let Some((path, file)) = pending.pop() {
        let text = fs::read_to_string(&file).unwrap();
        let text = match with_tests {
            true => text,
            false => non_test_code(&text),
        };
        let dir = match file.file_name().unwrap().to_str().unwrap() {
            "mod.rs" | "lib.rs" | "main.rs" => file.parent().unwrap().to_owned(),
            _ => file.with_extension(""),
        };
        for child in declared_modules(&text) {
            let candidates = [
                dir.join(format!("{child}.rs")),
                dir.join(&child).join("mod.rs"),
            ];
            let child_file = candidates
                .into_iter()
                .find(|c| c.exists())
                .unwrap_or_else(|| panic!("{}: mod {child} has no file", file.display()));
            pending.push(([path.clone(), vec![child]].concat(), child_file));
        }
        found.insert(path, file);
    }
    found
}

/// The text before any `#[cfg(test)]`: tests may use anything.
fn non_test_code(text: &str) -> String {
    text.split("#[cfg(test)]").next().unwrap().to_owned()
}

/// Lines without their `//` comments.
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().map(|l| l.split("//").next().unwrap())
}

/// The modules `text` declares with `mod name;`.
fn declared_modules(text: &str) -> Vec<String> {
    code_lines(text)
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("pub ").or(Some(l)))
        .filter_map(|l| l.strip_prefix("pub(crate) ").or(Some(l)))
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_owned)
        .collect()
}

/// The `use` statements of `text`, each tree without white space, and
/// whether it is re-exported (`pub use`, `pub(crate) use`). `as` keeps a
/// mark of its own:
/// `a::b as c` is `a::b@c`.
fn use_trees(text: &str) -> Vec<(String, bool)> {
    let code: String = code_lines(text).collect::<Vec<_>>().join("\n");
    let mut trees = Vec::new();
    let mut statement: Option<(String, bool)> = None;
    for line in code.lines().map(str::trim) {
        let opening = line
            .split_once("use ")
            .filter(|(before, _)| before.is_empty() || before.starts_with("pub"))
            .map(|(before, tree)| (tree.to_owned(), before.starts_with("pub")));
        let Some((tree, public)) = statement
            .take()
            .map(|(s, public)| (s + line, public))
            .or(opening)
        else {
            continue;
        };
        match tree.split_once(';') {
            Some((tree, _)) => trees.push((
                tree.replace(" as ", "@").replace(char::is_whitespace, ""),
                public,
            )),
            None => statement = Some((tree, public)),
        }
    }
    trees
}

/// Every path a file names: its `use` trees, expanded, and the paths in
/// its code that start at `crate`, `super`, `self` or one of `children`,
/// the modules it declares.
fn named_paths(text: &str, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let code: String = code_lines(text).collect::<Vec<_>>().join("\n");
    let mut paths = Vec::new();
    for (tree, _) in use_trees(text) {
        let mut expanded = Vec::new();
        expand(&tree, &mut expanded);
        paths.extend(expanded.into_iter().map(without_alias));
    }
    let starts = ["crate", "super", "self"]
        .into_iter()
        .chain(children.iter().map(String::as_str))
        .map(|start| format!("{start}::"));
    for start in starts {
        let mut rest = code.as_str();
        while let Some(at) = rest.find(&start) {
            let tail = &rest[at..];
            // A path starts a word: `super::` is not the end of `a_super::`,
            // nor a child's name the end of another path's segment.
            let starts_a_path = rest[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
            if !starts_a_path {
                rest = &tail[start.len()..];
                continue;
            }
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            let path = segments(&tail[..end]);
            // `crate::{…}` is a use tree, read above.
            if path.len() > 1 {
                paths.push(path);
            }
            rest = &tail[end..];
        }
    }
    paths
}

/// `path` without the alias `as` gave its last segment.
fn without_alias(mut path: Vec<String>) -> Vec<String> {
    if let Some(last) = path.last_mut() {
        *last = last.split('@').next().unwrap().to_owned();
    }
    path
}

/// The name a use path brings into scope: its alias, or its last segment.
fn imported_name(path: &[String]) -> Option<&str> {
    path.last()?.split('@').next_back()
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Expands a use tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(tree: &str, into: &mut Vec<Vec<String>>) {
    match tree.find('{') {
        None => into.push(segments(tree)),
        Some(open) => {
            let prefix = segments(&tree[..open]);
            let inner = &tree[open + 1..tree.rfind('}').unwrap()];
            let mut depth = 0;
            let mut start = 0;
            let mut items = Vec::new();
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        items.push(&inner[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            items.push(&inner[start..]);
            for item in items.into_iter().filter(|i| !i.is_empty()) {
                let mut expanded = Vec::new();
                expand(item, &mut expanded);
                for path in expanded {
                    into.push([prefix.clone(), path].concat());
                }
            }
        }
    }
}

/// The module a path names from module `from`: the longest known prefix,
/// and the segment after it, if any (an item of that module's).
fn resolve(
    from: &[String],
    children: &BTreeSet<String>,
    path: &[String],
    known: &BTreeMap<Vec<String>, PathBuf>,
) -> Option<(Vec<String>, Option<String>)> {
    let (mut base, rest) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (from.to_vec(), &path[1..]),
        "super" => {
            let mut base = from.to_vec();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            (base, rest)
        }
        child if children.contains(child) => (from.to_vec(), path),
        _ => return None,
    };
    let mut found = base.clone();
    let mut next = None;
    for segment in rest {
        base.push(segment.clone());
        if !known.contains_key(&base) {
            next = Some(segment.clone());
            break;
        }
        found.clone_from(&base);
    }
    known.contains_key(&found).then_some((found, next))
}

/// Each module's re-exports (`pub use`): the name it gives, and the
/// module the item lives in; `*` for a glob, with the module it empties.
type Reexports = BTreeMap<Vec<String>, Vec<(String, Vec<String>)>>;

fn reexports(known: &BTreeMap<Vec<String>, PathBuf>) -> Reexports {
    known
        .iter()
        .map(|(module, file)| {
            let text = non_test_code(&fs::read_to_string(file).unwrap());
            let children: BTreeSet<String> = declared_modules(&text).into_iter().collect();
            let mut given = Vec::new();
            for (tree, _) in use_trees(&text).into_iter().filter(|(_, public)| *public) {
                let mut paths = Vec::new();
                expand(&tree, &mut paths);
                for path in paths {
                    let name = imported_name(&path).unwrap_or_default().to_owned();
                    let target = resolve(module, &children, &without_alias(path), known);
                    if let Some((target, _)) = target.filter(|(t, _)| t != module) {
                        given.push((name, target));
                    }
                }
            }
            (module.clone(), given)
        })
        .collect()
}

/// Whether the file of module `module` defines an item called `name`.
fn defines(known: &BTreeMap<Vec<String>, PathBuf>, module: &[String], name: &str) -> bool {
    let text = fs::read_to_string(&known[module]).unwrap();
    let items = [
        "fn", "struct", "enum", "const", "static", "type", "trait", "mod",
    ];
    items.iter().any(|item| {
        ["(", " ", "<", ":", ";"]
            .iter()
            .any(|after| text.contains(&format!("{item} {name}{after}")))
    })
}

/// Where item `name` of `module` lives, through the module's re-exports.
fn through_reexports(
    module: Vec<String>,
    name: Option<String>,
    reexports: &Reexports,
    known: &BTreeMap<Vec<String>, PathBuf>,
) -> Vec<String> {
    let Some(name) = name else {
        return module;
    };
    let given = || reexports.get(&module).into_iter().flatten();
    let named = given().find(|(given, _)| *given == name);
    let globbed = || given().find(|(given, target)| given == "*" && defines(known, target, &name));
    match named.or_else(globbed) {
        // One step: a re-export of a re-export is rare, and it still names
        // the module that re-exports it.
        Some((_, target)) => target.clone(),
        None => module,
    }
}

/// Module → the modules it imports (not its own ancestors), for the crate
/// rooted at `root`. A path to an item a module re-exports leads to the
/// module the item lives in.
fn import_graph(root: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let known = modules(root, false);
    let reexports = reexports(&known);
    known
        .iter()
        .map(|(module, file)| {
            let text = non_test_code(&fs::read_to_string(file).unwrap());
            let children: BTreeSet<String> = declared_modules(&text).into_iter().collect();
            let imports = named_paths(&text, &children)
                .iter()
                .filter_map(|path| resolve(module, &children, path, &known))
                .map(|(target, item)| through_reexports(target, item, &reexports, &known))
                // A module is part of its ancestors: naming their items
                // (`super::`) is containment, not an import.
                .filter(|target| !module.starts_with(target))
                .collect();
            (module.clone(), imports)
        })
        .collect()
}

/// A cycle in `graph`, if there is one.
fn cycle(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<String>> {
    fn visit(
        node: &Vec<String>,
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        done: &mut BTreeSet<Vec<String>>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle: Vec<String> = stack[at..].iter().map(|m| m.join("::")).collect();
            cycle.push(node.join("::"));
            return Some(cycle);
        }
        if !done.insert(node.clone()) {
            return None;
        }
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

/// The directories of the workspace's packages, the fuzz targets' included.
const PACKAGES: [&str; 7] = ["agent", "common", "ebpf", "tests", "xtask", "lab", "fuzz"];

/// Every crate root of the workspace: each package's library and binary,
/// its build script, its test binaries and its fuzz targets.
fn crate_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for package in PACKAGES.map(|p| workspace().join(p)) {
        for file in ["src/lib.rs", "src/main.rs", "build.rs"] {
            let root = package.join(file);
            if root.exists() {
                roots.push(root);
            }
        }
        for dir in ["tests", "fuzz_targets"] {
            for entry in fs::read_dir(package.join(dir)).into_iter().flatten() {
                let path = entry.unwrap().path();
                match path.is_dir() {
                    true => roots.push(path.join("main.rs")),
                    false => roots.push(path),
                }
            }
        }
    }
    roots.retain(|r| r.extension().is_some_and(|e| e == "rs"));
    roots
}

/// Every Rust file under the packages' directories.
fn rust_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs: Vec<PathBuf> = PACKAGES.iter().map(|p| workspace().join(p)).collect();
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let nested_package = path.join("Cargo.toml").exists();
            let ignored = ["target", "corpus"].iter().any(|d| path.ends_with(d));
            if path.is_dir() && !nested_package && !ignored {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn every_rust_file_belongs_to_a_crate_the_checks_read() {
    let reached: BTreeSet<PathBuf> = crate_roots()
        .iter()
        .flat_map(|root| modules(root, true).into_values())
        .map(|f| f.canonicalize().unwrap())
        .collect();
    let stray: Vec<PathBuf> = rust_files()
        .into_iter()
        .filter(|f| !reached.contains(&f.canonicalize().unwrap()))
        .collect();
    assert!(stray.is_empty(), "files no crate root declares: {stray:?}");
    assert!(reached.len() > 200, "only {} files reached", reached.len());
}

#[test]
fn a_module_with_submodules_is_a_directory_with_its_mod_rs() {
    let beside_a_directory: Vec<PathBuf> = rust_files()
        .into_iter()
        .filter(|f| f.with_extension("").is_dir())
        .collect();
    assert!(
        beside_a_directory.is_empty(),
        "use name/mod.rs for these: {beside_a_directory:?}"
    );
}

#[test]
fn no_file_of_any_crate_outgrows_a_reader() {
    let long: Vec<String> = rust_files()
        .iter()
        .map(|f| (f, fs::read_to_string(f).unwrap().lines().count()))
        .filter(|(_, lines)| *lines > LONGEST_FILE)
        .map(|(f, lines)| format!("{}: {lines}", f.display()))
        .collect();
    assert!(
        long.is_empty(),
        "files over {LONGEST_FILE} lines: {long:#?}"
    );
}

/// Writes a crate of `files` (path, text) under a new directory, and
/// returns its root file.
fn planted(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = isthmus_tests::scratch_dir();
    for (path, text) in files {
        let file = dir.path().join(path);
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(file, text).unwrap();
    }
    let root = dir.path().join("lib.rs");
    (dir, root)
}

#[test]
fn a_cycle_is_found_however_its_paths_are_spelled() {
    // a → b by `crate::`, b → b::c by a bare child path, c → a by a use.
    let bare_child = [
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "pub fn f() { crate::b::g(); }\n"),
        ("b/mod.rs", "mod c;\npub fn g() { c::h(); }\n"),
        ("b/c.rs", "use crate::a;\npub fn h() { a::f(); }\n"),
    ];
    // a → b::c by `super::super::` from a child, c → a through a
    // re-export in lib.rs.
    let nested_super = [
        ("lib.rs", "mod a;\nmod b;\npub use a::f;\n"),
        ("a/mod.rs", "mod d;\npub fn f() { d::e(); }\n"),
        ("a/d.rs", "pub fn e() { super::super::b::c::h(); }\n"),
        ("b/mod.rs", "pub mod c;\n"),
        ("b/c.rs", "pub fn h() { crate::f(); }\n"),
    ];
    for files in [&bare_child[..], &nested_super[..]] {
        let (_dir, root) = planted(files);
        let graph = import_graph(&root);
        assert!(cycle(&graph).is_some(), "no cycle found in {graph:?}");
    }
    // Without the edge back, none: `my_a::` names no module of the crate.
    let (_dir, root) = planted(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "pub fn f() { crate::b::g(); }\n"),
        ("b.rs", "pub fn g() { let a_b = 1; my_a::f(a_b); }\n"),
    ]);
    assert_eq!(cycle(&import_graph(&root)), None);
}

#[test]
fn no_file_of_any_crate_imports_one_that_imports_it_back() {
    for root in crate_roots() {
        let graph = import_graph(&root);
        if let Some(cycle) = cycle(&graph) {
            panic!("{}: import cycle {}", root.display(), cycle.join(" -> "));
        }
    }
}

#[test]
fn the_agents_layers_import_only_downwards() {
    let graph = import_graph(&workspace().join("agent/src/lib.rs"));
    let layer = |module: &[String]| {
        module
            .first()
            .and_then(|top| LAYERS.iter().position(|l| l == top))
    };
    let mut upwards = Vec::new();
    for (from, imports) in &graph {
        for to in imports {
            if let (Some(a), Some(b)) = (layer(from), layer(to))
                && b > a
            {
                upwards.push(format!("{} -> {}", from.join("::"), to.join("::")));
            }
        }
    }
    assert!(
        upwards.is_empty(),
        "imports against the layers: {upwards:#?}"
    );
    // Every layer is imported by some module: the check sees real imports.
    let imported: BTreeSet<usize> = graph.values().flatten().filter_map(|m| layer(m)).collect();
    assert_eq!(imported.len(), LAYERS.len(), "{imported:?}");
}

#[test]
fn the_agent_is_small_pieces() {
    let src = workspace().join("agent/src");
    let top: Vec<String> = fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(top.len() <= MOST_TOP_ENTRIES, "agent/src holds {top:?}");
    let main = fs::read_to_string(src.join("main.rs")).unwrap();
    assert!(
        main.lines().count() < LONGEST_MAIN,
        "main.rs has {} lines",
        main.lines().count()
    );
}
