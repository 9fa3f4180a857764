"""What `tune` writes in words: the table of the path, the sentences on its noise and rounds, the
probe's stage table, the closing line, tuned.yaml and the same overrides as an experiment config,
from the trials and comparisons of bwopt.sweep.tune_record. No TensorFlow.
"""

from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from omegaconf import OmegaConf

from bwopt.measure.uncertainty import Comparison, rounds_to_find
from bwopt.sweep.tune_record import Trial, against
from bwopt.sweep.tune_setup import MAX_EXTRA_ROUNDS

TABLE_HEADER = (
    "| trial | change | reason | throughput, examples/s (95 % CI) | × start | of min(ceilings) | kept "
    "| runs (job folders) |\n"
    "|---|---|---|---|---|---|---|---|"
)


def ratio_text(comparison: Comparison) -> str:
    low, high = comparison.ci95
    return f"×{comparison.ratio:.2f} ({comparison.interval_name} ×{low:.2f}–×{high:.2f})"


def figure_text(trial: Trial) -> str:
    if trial.failed:
        return "failed"
    interval = f" ({trial.ci95[0]:,.0f}–{trial.ci95[1]:,.0f})" if trial.ci95 else ""
    return f"{trial.throughput:,.0f}{interval}"


def table(trials: Sequence[Trial]) -> str:
    """The path as Markdown: one row per trial."""
    start = trials[0]
    rows = [TABLE_HEADER]
    for trial in trials:
        ratio = "" if trial.failed or start.failed else f"×{against(trial, start).ratio:.2f}"
        of_ceiling = f"{trial.of_ceiling:.2f} ({trial.ceiling_name})" if trial.of_ceiling else ""
        changed = ", ".join(f"`{key}={value}`" for key, value in trial.overrides.items()) if trial.number else ""
        change = f"{trial.change}: {changed}" if changed else trial.change
        kept = "yes" if trial.kept else f"no: {trial.note}" if trial.note else "no"
        runs = f"{len(trial.folders)} ({', '.join(folder.name for folder in trial.folders)})" if trial.folders else ""
        reason = trial.reason.replace("|", "/")
        cells = [str(trial.number), change, reason, figure_text(trial), ratio, of_ceiling, kept, runs]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def slow_sentence(trials: Sequence[Trial]) -> str:
    """How much of each run's timed window went in slow episodes (bwopt.measure.episodes), per
    trial: where a trial's runs scatter, what moved them; "" when no run's window could tell."""
    shown = []
    for trial in trials:
        shares = [f"{share * 100:.0f} %" for share in trial.slow_time_fractions if share is not None]
        if shares:
            shown.append(f"{trial.number}: {', '.join(shares)}")
    if not shown:
        return ""
    return (
        "Slow episodes (0.5 s windows below 0.6 of their run's median rate), the share of each run's "
        f"timed window, per trial: {'; '.join(shown)}. A run slow throughout reads 0 %: the episodes are "
        "relative to the run itself."
    )


def noise_sentence(repeats: int, pooled: Optional[Tuple[float, int]], drift: Optional[Tuple[float, int]] = None) -> str:
    """What the comparisons held: one run's noise, or the spread between a trial's repeats, and the
    machine's drift between trials where incumbents ran again beside later candidates (`drift_spread`)."""
    runs = "once" if repeats == 1 else f"{repeats} times"
    ran = f"each trial ran {runs}" + (
        ", and the incumbent as often beside each candidate" if drift else ", one after the other"
    )
    if drift:
        measured = (
            f"the machine's drift from one trial to the next, from how the incumbents' runs beside later "
            f"candidates scatter: {drift[0] * 100:.1f} % ({freedom(drift[1])})"
        )
    else:
        measured = ""
    if pooled is None:
        within = "each run's own interval (blocks of its timed steps), not the noise from one run to the next"
        if drift:
            return f"Noise: {ran}. Every comparison held {within}, and {measured}."
        if repeats > 1:
            return f"Noise: {ran}, but no trial finished two runs, so every comparison held {within}."
        return (
            f"Noise: {ran}, so every comparison held {within}; `hydra.sweeper.repeats=2` (the default) runs "
            "each trial twice and pools the spread between repeats into every comparison."
        )
    spread = (
        f"each run's interval and the spread between runs of one setting in one round, pooled over the "
        f"trials: {pooled[0] * 100:.1f} % of throughput (standard deviation, {freedom(pooled[1])}), or a "
        "setting's own where it scatters more"
    )
    if drift:
        leaning = (
            " Where the drift outweighs the spread, a comparison leans on the runs of both in the same "
            "rounds, where it cancels (a least-squares contrast), so its ratio can differ from the medians' ratio."
            if drift[0] > 0
            else ""
        )
        return f"Noise: {ran}. Every comparison held {spread}, and {measured}.{leaning}"
    return (
        f"Noise: {ran}. Every comparison held {spread}. Drift of the machine between one trial's runs and "
        "the next trial's is not in it (`hydra.sweeper.rerun_incumbent=true` measures it)."
    )


def rounds_note(predicted_gain: Optional[float], comparison: Comparison, rounds: int, repeats: int) -> str:
    """For an undecided candidate after `rounds` rounds of `repeats` runs: about how many rounds would
    find the gain the model expected of it four times in five at the spread they measured, and the
    `extra_rounds` that buys them; "" where that says nothing."""
    if comparison.word != "no difference detected" or not predicted_gain:
        return ""
    needed = rounds_to_find(comparison, rounds, predicted_gain)
    if needed is None or needed <= rounds:
        return ""
    setting = (
        f"hydra.sweeper.extra_rounds={needed - 1}"
        if needed - 1 <= MAX_EXTRA_ROUNDS
        else f"more than hydra.sweeper.extra_rounds allows, {MAX_EXTRA_ROUNDS}"
    )
    return (
        f"; the model's ×{predicted_gain:.2f} would take about {needed} rounds of "
        f"{repeats} run(s) to be found 4 times in 5 at this spread ({setting})"
    )


def rounds_sentence(extra_rounds: int, level: float, extended: Sequence[int]) -> str:
    """What the extra rounds did and the level every comparison with the incumbent took for them."""
    if not extra_rounds:
        return ""
    trials = f"trial{'s' if len(extended) > 1 else ''} {', '.join(map(str, extended))}"
    did = f" ({trials} did)" if extended else " (none needed one)"
    rounds = f"{extra_rounds} round{'' if extra_rounds == 1 else 's'}"
    return (
        f"Rounds: a candidate undecided but leaning its way could run up to {rounds} more{did}; every "
        f"comparison with the incumbent took {level * 100:.1f} % per look (Pocock's level for {extra_rounds + 1} "
        "looks), so a candidate's looks together call noise a difference no more often than one 95 % comparison."
    )


def freedom(degrees: int) -> str:
    return f"{degrees} degree{'' if degrees == 1 else 's'} of freedom"


def stage_table(picture: dict) -> str:
    """The probe's per-stage picture of the start as Markdown: what each stage costs per batch."""
    rows = [
        "| stage | kind | ms per batch (one core) | parallel | random | bytes per example out |",
        "|---|---|---|---|---|---|",
    ]
    for stage in picture["stages"]:
        cells = [
            stage["name"],
            stage["kind"],
            f"{stage['cost_per_batch_s'] * 1e3:,.2f}" + (" (waits)" if stage.get("io_bound") else ""),
            "yes" if stage.get("parallel") else "no",
            "yes" if stage.get("random") else "no",
            f"{stage.get('output_bytes_per_example', 0):,.0f}",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def closing_line(
    start: Trial,
    final: Trial,
    num_runs: int,
    elapsed_s: float,
    pooled: Optional[Tuple[float, int]] = None,
    drift: Optional[Tuple[float, int]] = None,
    num_trials: int = 0,
) -> str:
    """'tuned: ×3.1 over the start (95 % CI ×2.8–×3.4), 0.93 of the input ceiling, 4 runs, 2 min'
    (`num_trials`: the trials run, the start's included; 1 says no change was run)."""
    minutes = f"{elapsed_s / 60:.0f} min" if elapsed_s >= 90 else f"{elapsed_s:.0f} s"
    if start.failed or final.failed:
        return f"tuned: nothing measured to compare, {num_runs} runs, {minutes}"
    if final is start and num_trials == 1:
        gain = "the start as given, no change run"
    elif final is start:
        gain = "no change beat the start beyond the noise"
    else:
        comparison = against(final, start, pooled, drift)
        low, high = comparison.ci95
        gain = f"×{comparison.ratio:.1f} over the start (95 % CI ×{low:.1f}–×{high:.1f})"
    ceiling = f", {final.of_ceiling:.2f} of the {final.ceiling_name}" if final.of_ceiling else ""
    runs = f"{num_runs} run" if num_runs == 1 else f"{num_runs} runs"
    return f"tuned: {gain}{ceiling}, {runs}, {minutes}"


def tuned_overrides(base: Sequence[str], overrides: Dict[str, str]) -> List[str]:
    """The workload's overrides (without tune's own) followed by what tune kept."""
    kept_keys = set(overrides)
    workload = [item for item in base if item.split("=", 1)[0].lstrip("+~") not in kept_keys]
    return [*workload, *(f"{key}={value}" for key, value in overrides.items())]


def write_tuned(path: Path, base: Sequence[str], overrides: Dict[str, str]) -> Path:
    """tuned.yaml: one override per line, no comments, so `python -m bwopt $(cat tuned.yaml)` runs it
    (and YAML reads it as one string of them)."""
    path.write_text("\n".join(tuned_overrides(base, overrides)) + "\n")
    return path


def experiment_text(overrides: Sequence[str], is_group: Callable[[str], bool], comments: Sequence[str] = ()) -> str:
    """The overrides as an experiment config like conf/experiment/'s presets (`# @package _global_`):
    the preset they start from, then `_self_`, then their group choices in its defaults list; their
    values as nested keys.

    Raises ValueError for an override a config file cannot hold (a deletion, a package)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    includes, choices, values = [], [], OmegaConf.create()
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key, value = override.key_or_group, override.value()
        if override.is_delete() or override.package is not None:
            raise ValueError(f"`{override.input_line}` has no form in a config file")
        if key == "experiment":
            if value is not None:
                includes.append(f"/experiment/{value}")
        elif is_group(key) and override.is_add():  # a group the defaults list leaves out
            includes.append({f"/{key}": value})
        elif is_group(key):
            choices.append({f"override /{key}": value})
        else:
            OmegaConf.update(values, key, value, force_add=True)
    body = OmegaConf.merge(OmegaConf.create({"defaults": [*includes, "_self_", *choices]}), values)
    header = ["# @package _global_", *(f"# {comment}" for comment in comments)]
    return "\n".join(header) + "\n" + OmegaConf.to_yaml(body)


def write_experiment(path: Path, overrides: Sequence[str], loader, config_name: str, comments: Sequence[str]) -> str:
    """Write `experiment_text` to `path` (an `experiment/` folder) only if Hydra's `loader` composes it,
    as `experiment=NAME` with the folder's parent on the search path, to the config the overrides
    give; '' when written, else why not."""
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf.errors import OmegaConfBaseException

    def composed(items: Sequence[str]) -> dict:
        config = OmegaConf.to_container(loader.load_configuration(config_name, list(items), RunMode.RUN))
        config.pop("hydra", None)
        return config

    try:
        text = experiment_text(overrides, lambda key: bool(loader.get_group_options(key)), comments)
    except ValueError as error:
        return str(error)
    made = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    # (the search path joins the loader's for good: harmless, the tuning's last composition)
    search_path = f"hydra.searchpath=['file://{path.parent.parent.resolve()}']"
    try:
        if composed([search_path, f"experiment={path.stem}"]) == composed(overrides):
            return ""
        reason = "it composes to a config other than the overrides'"
    except (HydraException, OmegaConfBaseException) as error:
        reason = f"it does not compose: {str(error).splitlines()[0]}"
    path.unlink()
    if made:
        path.parent.rmdir()
    return reason
