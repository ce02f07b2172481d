//! The command-line reference page: clap's own long help of `overseer` and
//! of every subcommand, rendered from the binary's command tree (hidden
//! commands left out), and the flags that read an environment variable.

/// The command tree as the binary builds it, with environment values hidden
/// (the page must not depend on the environment it is generated in).
fn command(cli: &clap::Command) -> clap::Command {
    let mut cmd = hide_env_values(cli.clone());
    cmd.build();
    cmd
}

fn hide_env_values(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| a.hide_env_values(true))
        .mut_subcommands(hide_env_values)
}

/// Every visible command, depth first, with its path of names.
fn walk(cmd: &clap::Command, path: &mut Vec<String>, out: &mut Vec<(String, clap::Command)>) {
    path.push(cmd.get_name().to_owned());
    out.push((path.join(" "), cmd.clone()));
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        walk(sub, path, out);
    }
    path.pop();
}

/// `(variable, flag)` for every flag that reads an environment variable,
/// e.g. `("OVERSEER_CONFIG", "`--config` of `overseer run`, …")`.
pub(super) fn env_flags(cli: &clap::Command) -> Vec<(String, String)> {
    let mut commands = Vec::new();
    walk(&command(cli), &mut Vec::new(), &mut commands);
    let mut by_var: Vec<(String, Vec<String>)> = Vec::new();
    for (path, cmd) in &commands {
        for arg in cmd.get_arguments() {
            let Some(var) = arg.get_env() else { continue };
            let var = var.to_string_lossy().into_owned();
            let flag = arg
                .get_long()
                .map_or_else(|| arg.get_id().to_string(), |l| format!("--{l}"));
            let used = format!("`{flag}` of `{path}`");
            match by_var.iter_mut().find(|(v, _)| *v == var) {
                Some((_, uses)) => uses.push(used),
                None => by_var.push((var, vec![used])),
            }
        }
    }
    by_var.sort();
    by_var
        .into_iter()
        .map(|(var, uses)| (var, uses.join(", ")))
        .collect()
}

/// The command-line reference page.
pub(super) fn render(cli: &clap::Command) -> String {
    let mut commands = Vec::new();
    walk(&command(cli), &mut Vec::new(), &mut commands);
    let mut out = String::from("# Command line\n\n");
    out.push_str(
        "The help of `overseer` and of each of its subcommands, as `overseer … --help` \
         prints it.\n\n",
    );
    for (path, _) in &commands {
        out.push_str(&format!("- [`{path}`](#{})\n", path.replace(' ', "-")));
    }
    for (path, mut cmd) in commands {
        let help = cmd.render_long_help().to_string();
        out.push_str(&format!(
            "\n## {path}\n\n```text\n{}\n```\n",
            help.trim_end()
        ));
    }
    out
}
