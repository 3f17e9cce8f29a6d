//! The command-line reference page, made from clap's command tree: every subcommand with its
//! usage, its description and a row per flag (with its default, its values and the environment
//! variable that stands in for it), and the environment variables the host reads.

use std::fmt::Write as _;

use clap::{Arg, ArgAction, Command};

/// The page's opening.
const INTRO: &str = "\
Every command and flag of `dedup-host`, as `dedup-host <command> --help` prints them. What the
commands are for, with examples: [commands at a glance](commands.md); what each exits with:
[exit codes](exit-codes.md).
";

/// The pages the commands are split over (file, title, the top-level commands on it); a
/// command named on none goes on the last.
const GROUPS: &[(&str, &str, &[&str])] = &[
    (
        "cli-handlers.md",
        "Commands: write, test and run handlers",
        &[
            "invoke", "new", "build", "wit", "test", "run", "dev", "publish", "tail", "schema",
        ],
    ),
    ("cli-operate.md", "Commands: deploy and operate", &[]),
];

/// The pages, generated from `cli` (the binary's own command, `Cli::command()`): an index with
/// the environment variables, and the commands' flags split over [`GROUPS`].
pub fn pages(mut cli: Command) -> Vec<(&'static str, String)> {
    cli.build();
    let mut commands = Vec::new();
    collect(&cli, "dedup-host", &mut commands);
    let commands = &commands[1..];
    let group_of = |path: &str| {
        let top = path.split(' ').nth(1).unwrap_or("");
        GROUPS
            .iter()
            .position(|(_, _, names)| names.contains(&top))
            .unwrap_or(GROUPS.len() - 1)
    };
    let mut index = String::from("# Command-line reference\n\n");
    index.push_str(super::GENERATED);
    index.push('\n');
    index.push_str(INTRO);
    index.push_str("\n| command | what |\n|---|---|\n");
    for (path, command) in commands {
        let _ = writeln!(
            index,
            "| [`{path}`]({}#{}) | {} |",
            GROUPS[group_of(path)].0,
            anchor(path),
            super::cell(&about(command))
        );
    }
    index.push_str("\n## Environment variables\n\n");
    index.push_str("| variable | what |\n|---|---|\n");
    for (name, what) in super::env::variables(commands) {
        let _ = writeln!(index, "| `{name}` | {} |", super::cell(&what));
    }
    let mut pages = vec![("cli.md", index)];
    for (i, (file, title, _)) in GROUPS.iter().enumerate() {
        let mut out = format!(
            "# {title}\n\n{}\nEvery command: [command-line reference](cli.md).\n",
            super::GENERATED
        );
        for (path, command) in commands.iter().filter(|(p, _)| group_of(p) == i) {
            command_section(&mut out, path, command);
        }
        pages.push((*file, out));
    }
    pages
}

/// Every visible command under `command`, depth first, with its full path.
fn collect<'a>(command: &'a Command, path: &str, out: &mut Vec<(String, &'a Command)>) {
    out.push((path.to_string(), command));
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        collect(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

/// One command: heading, usage, description, flags.
fn command_section(out: &mut String, path: &str, command: &Command) {
    let _ = writeln!(out, "\n## `{path}`\n");
    let long = command
        .get_long_about()
        .or(command.get_about())
        .map(ToString::to_string)
        .unwrap_or_default();
    if !long.is_empty() {
        let _ = writeln!(out, "{}\n", super::paragraphs(&long));
    }
    let usage = command
        .clone()
        .bin_name(path)
        .render_usage()
        .to_string()
        .replace("Usage: ", "");
    let _ = writeln!(out, "```text\n{usage}\n```\n");
    let args: Vec<&Arg> = command
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    if args.is_empty() {
        return;
    }
    out.push_str("| flag | default | what |\n|---|---|---|\n");
    for arg in args {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            super::flag(arg),
            default(arg),
            super::cell(&help(arg))
        );
    }
}

/// An argument's default, or `none`.
fn default(arg: &Arg) -> String {
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if defaults.is_empty() || !matches!(arg.get_action(), ArgAction::Set | ArgAction::Append) {
        "".to_string()
    } else {
        format!("`{}`", defaults.join(" "))
    }
}

/// An argument's help, with its possible values and its environment variable.
fn help(arg: &Arg) -> String {
    let mut text = arg
        .get_long_help()
        .or(arg.get_help())
        .map(ToString::to_string)
        .unwrap_or_default();
    if !text.is_empty() && !text.ends_with(['.', ')', ':']) {
        text.push('.');
    }
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if !values.is_empty() && matches!(arg.get_action(), ArgAction::Set | ArgAction::Append) {
        let _ = write!(text, " One of {}.", values.join(", "));
    }
    if let Some(env) = arg.get_env() {
        let _ = write!(text, " Environment: `{}`.", env.to_string_lossy());
    }
    if arg.is_required_set() {
        text.push_str(" Required.");
    }
    text
}

/// A command's one-line description.
fn about(command: &Command) -> String {
    command
        .get_about()
        .map(ToString::to_string)
        .unwrap_or_default()
}

/// The anchor mdBook gives a `## \`dedup-host x y\`` heading.
fn anchor(path: &str) -> String {
    path.chars()
        .filter_map(|c| match c {
            ' ' | '-' => Some('-'),
            c if c.is_alphanumeric() || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}
