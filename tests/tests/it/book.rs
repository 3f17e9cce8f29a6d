//! The book under `docs/` (mdBook): SUMMARY.md lists every page and every page it lists exists;
//! every relative link and `#anchor` in the book, README.md and BENCHMARKS.md resolves, by
//! mdBook's anchor rule; every alert rule's runbook annotation points at its own section.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use dedup_host_tests::guests::workspace_root;

/// The book's pages, relative to the repository: what `mdbook build docs` renders.
const BOOK_SRC: &str = "docs/src";
/// Pages outside the book whose links are checked the same way.
const OTHER_PAGES: [&str; 2] = ["README.md", "BENCHMARKS.md"];
/// The alert rules whose `runbook:` annotations point into the book.
const ALERT_RULES: &str = "deploy/prometheus/dedup-host-rules.yml";
/// How an anchor is made, said with every anchor problem.
const ANCHOR_RULE: &str = "mdBook's anchor of a heading is its text lowercased, spaces turned \
                           to '-', punctuation other than '-' and '_' dropped";

/// mdBook's id for a heading's text (`normalize_id`): alphanumerics, '-' and '_' kept and
/// lowercased, whitespace turned to '-', everything else dropped.
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().to_string())
            } else if c.is_whitespace() {
                Some("-".to_string())
            } else {
                None
            }
        })
        .collect()
}

/// `path` with `.` and `..` resolved by name, as a link is.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// `path` as the repository names it, for messages.
fn rel(root: &Path, path: &Path) -> String {
    let path = normalize(path);
    path.strip_prefix(normalize(root))
        .unwrap_or(&path)
        .display()
        .to_string()
}

/// Every Markdown file under `dir`, sorted.
fn book_pages(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(book_pages(&path));
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// A page as mdBook reads it: each `{{#include FILE:NAME}}` line replaced by the lines between
/// `ANCHOR: NAME` and `ANCHOR_END: NAME` in FILE; a missing file or anchor is a problem.
fn page_text(root: &Path, page: &Path, problems: &mut Vec<String>) -> String {
    let text = std::fs::read_to_string(page).unwrap_or_else(|e| panic!("{}: {e}", rel(root, page)));
    let mut out = String::new();
    for line in text.lines() {
        let directive = line
            .trim()
            .strip_prefix("{{#include ")
            .and_then(|rest| rest.strip_suffix("}}"));
        let Some(directive) = directive else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let (file, name) = directive.trim().split_once(':').unwrap_or((directive, ""));
        let source = page.parent().unwrap().join(file);
        let Ok(included) = std::fs::read_to_string(&source) else {
            problems.push(format!(
                "{}: `{}` includes {}, which does not exist: fix the path (relative to the page)",
                rel(root, page),
                line.trim(),
                rel(root, &source)
            ));
            continue;
        };
        if name.is_empty() {
            out.push_str(&included);
            continue;
        }
        let (start, end) = (format!("ANCHOR: {name} "), format!("ANCHOR_END: {name} "));
        let (mut inside, mut found) = (false, false);
        for l in included.lines() {
            if l.contains(&end) {
                inside = false;
            } else if l.contains(&start) {
                (inside, found) = (true, true);
            } else if inside && !l.contains("ANCHOR:") && !l.contains("ANCHOR_END:") {
                out.push_str(l);
                out.push('\n');
            }
        }
        if !found {
            problems.push(format!(
                "{}: `{}`: {} has no `<!-- ANCHOR: {name} -->` line: add the pair \
                 `ANCHOR: {name}` / `ANCHOR_END: {name}` around the part to include",
                rel(root, page),
                line.trim(),
                rel(root, &source)
            ));
        }
    }
    out
}

/// The paragraphs of `text` outside fenced code blocks (where `#` lines are not headings and
/// brackets are not links).
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut paragraphs = vec![String::new()];
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            paragraphs.push(String::new());
        } else if fenced {
            continue;
        } else if line.trim().is_empty() {
            paragraphs.push(String::new());
        } else {
            let last = paragraphs.last_mut().unwrap();
            last.push_str(line);
            last.push('\n');
        }
    }
    paragraphs.retain(|p| !p.is_empty());
    paragraphs
}

/// `text` without its `[label](target)` targets (a heading's anchor is made of its label).
fn without_link_targets(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        out.push_str(&rest[..i]);
        rest = &rest[i + 2..];
        rest = rest.find(')').map_or("", |j| &rest[j + 1..]);
    }
    out.push_str(rest);
    out
}

/// The anchors a page's headings give, the later of two equal ones with `-1`, `-2`, ... as
/// mdBook numbers them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for paragraph in prose(text) {
        for line in paragraph.lines() {
            let hashes = line.chars().take_while(|&c| c == '#').count();
            if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
                continue;
            }
            let id = anchor(&without_link_targets(line[hashes..].trim()));
            let n = seen.entry(id.clone()).or_insert(0);
            out.insert(if *n == 0 { id } else { format!("{id}-{n}") });
            *n += 1;
        }
    }
    out
}

/// The targets of the Markdown links and images in `text`, outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for paragraph in prose(text) {
        // Code spans (`...`) hold brackets that are not links.
        let outside_code: String = paragraph.split('`').step_by(2).collect();
        let mut rest = outside_code.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            out.push(target.trim_matches(['<', '>']).to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// Every relative link of `page` (its text as mdBook reads it) whose file or anchor is missing.
fn check_links(root: &Path, page: &Path, text: &str, problems: &mut Vec<String>) {
    for target in links(text) {
        if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, fragment) = target.split_once('#').unwrap_or((target.as_str(), ""));
        let dest = if file.is_empty() {
            page.to_path_buf()
        } else {
            normalize(&page.parent().unwrap().join(file))
        };
        if !dest.exists() {
            problems.push(format!(
                "{}: link `{target}` points at {}, which does not exist: fix the path \
                 (relative to the page) or add the file",
                rel(root, page),
                rel(root, &dest)
            ));
            continue;
        }
        if fragment.is_empty() || dest.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let found = anchors(&page_text(root, &dest, &mut Vec::new()));
        if !found.contains(fragment) {
            problems.push(format!(
                "{}: link `{target}`: {} has no heading with the anchor `#{fragment}`; fix \
                 the anchor ({ANCHOR_RULE}); its anchors: {}",
                rel(root, page),
                rel(root, &dest),
                found.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }
}

/// Every broken link of the book under `root`, README.md and BENCHMARKS.md.
fn link_problems(root: &Path) -> Vec<String> {
    let mut pages = book_pages(&root.join(BOOK_SRC));
    pages.extend(OTHER_PAGES.iter().map(|p| root.join(p)));
    let mut problems = Vec::new();
    for page in pages {
        let text = page_text(root, &page, &mut problems);
        check_links(root, &page, &text, &mut problems);
    }
    problems
}

#[test]
fn every_link_and_anchor_in_the_book_and_the_readme_resolves() {
    let problems = link_problems(&workspace_root());
    assert!(
        problems.is_empty(),
        "{} broken links:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_summary_lists_every_page_and_every_page_it_lists_exists() {
    let root = workspace_root();
    let src = root.join(BOOK_SRC);
    let summary = src.join("SUMMARY.md");
    let listed: BTreeSet<PathBuf> = links(&std::fs::read_to_string(&summary).unwrap())
        .iter()
        .map(|target| normalize(&src.join(target)))
        .collect();
    let mut problems = Vec::new();
    for page in &listed {
        if !page.exists() {
            problems.push(format!(
                "{BOOK_SRC}/SUMMARY.md lists {}, which does not exist: create the page or \
                 drop the entry",
                rel(&root, page)
            ));
        }
    }
    for page in book_pages(&src) {
        if page != summary && !listed.contains(&normalize(&page)) {
            problems.push(format!(
                "{} is not in {BOOK_SRC}/SUMMARY.md, so the book never shows it: list it \
                 where a reader would look for it, or delete it",
                rel(&root, &page)
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_alert_links_its_own_runbook_section() {
    let root = workspace_root();
    let rules = std::fs::read_to_string(root.join(ALERT_RULES)).unwrap();
    let mut problems = Vec::new();
    let mut alert = None;
    let mut runbooks = 0;
    for line in rules.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("- alert: ") {
            alert = Some(name.trim());
        }
        let Some(link) = line.strip_prefix("runbook: ") else {
            continue;
        };
        let link = link.trim_matches('"');
        let name = alert.expect("a runbook annotation belongs to an alert");
        runbooks += 1;
        let (file, fragment) = link.split_once('#').unwrap_or((link, ""));
        let own = anchor(name);
        let page = root.join(file);
        if !page.exists() {
            problems.push(format!(
                "{ALERT_RULES}: {name}'s runbook `{link}` points at {file}, which does not \
                 exist: point it at the book's runbooks page"
            ));
        } else if fragment != own {
            problems.push(format!(
                "{ALERT_RULES}: {name}'s runbook `{link}` should end in `#{own}`, the \
                 alert's own section"
            ));
        } else if !anchors(&page_text(&root, &page, &mut problems)).contains(fragment) {
            problems.push(format!(
                "{ALERT_RULES}: {name}'s runbook `{link}`: {file} has no `## {name}` \
                 section: add one (when it fires, what to do)"
            ));
        }
    }
    assert!(runbooks > 0, "{ALERT_RULES} has no runbook annotations");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn anchors_follow_mdbooks_rule() {
    assert_eq!(
        anchor("Sizing: `concurrency`, `max_in_flight` and hosts"),
        "sizing-concurrency-max_in_flight-and-hosts"
    );
    assert_eq!(
        anchor("`dedup = \"forever\"`: one message per subject"),
        "dedup--forever-one-message-per-subject"
    );
    let found = anchors("# A\n\n## Same\n\n## Same [x](y.md)\n\n```sh\n# not a heading\n```\n");
    let expected: BTreeSet<String> = ["a", "same", "same-x"].map(String::from).into();
    assert_eq!(found, expected);
    let twice = anchors("## Same\n\n## Same\n");
    assert!(twice.contains("same-1"), "{twice:?}");
}

/// Writes `text` to `path` under `root`, making its folders.
fn write(root: &Path, path: &str, text: &str) {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_missing_page_anchor_or_include_is_reported_with_its_page_and_link() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(
        root,
        "README.md",
        "# Top\n\n<!-- ANCHOR: part -->\nSee [b](docs/src/a/b.md#the-rules-of-it).\n\
         <!-- ANCHOR_END: part -->\n",
    );
    write(root, "BENCHMARKS.md", "# Figures\n");
    write(root, "docs/src/SUMMARY.md", "- [B](a/b.md)\n");
    write(
        root,
        "docs/src/a/b.md",
        "# B\n\n## The rules: of `it`\n\n[fine](#the-rules-of-it) [gone](c.md) \
         [wrong](#the-rules) `[code](d.md)`\n\n```sh\n# not a heading\n[no](e.md)\n```\n\n\
         {{#include ../../../README.md:part}}\n{{#include ../../../README.md:nope}}\n",
    );
    let problems = link_problems(root);
    let expected = [
        "docs/src/a/b.md: link `c.md` points at docs/src/a/c.md",
        "docs/src/a/b.md: link `#the-rules`: docs/src/a/b.md has no heading",
        "docs/src/a/b.md: `{{#include ../../../README.md:nope}}`: README.md has no",
        // A link in an included part resolves from the page that includes it.
        "link `docs/src/a/b.md#the-rules-of-it` points at docs/src/a/docs/src/a/b.md",
    ];
    for text in expected {
        assert!(
            problems.iter().any(|p| p.contains(text)),
            "`{text}` not reported: {problems:#?}"
        );
    }
    assert_eq!(problems.len(), expected.len(), "{problems:#?}");
}
