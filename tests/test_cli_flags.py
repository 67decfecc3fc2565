"""Every ``dreamshard`` subcommand's flags, walked through the parsers: one meaning per
name for the batch flags, and help texts that say what the measuring flags measure."""

from __future__ import annotations

import argparse

import pytest

from torchrec_dreamshard.cli import SUBCOMMANDS, build_parser, main


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {name: a for a in parser._actions for name in a.option_strings}


def test_every_subcommand_is_walked():
    assert sorted(subparsers()) == sorted(SUBCOMMANDS)


def test_every_batch_flag_says_per_rank_or_global_in_its_name_and_help():
    """``--global-batch-size`` is the global batch, ``--batch-size`` per rank (TorchRec's
    ``batch_size``); no other batch flag, and the help agrees with the name."""
    seen = {}
    for command, parser in subparsers().items():
        for name, action in flags(parser).items():
            if "batch" not in name or action.help == argparse.SUPPRESS:
                continue
            seen[f"{command} {name}"] = action.help
            help_text = " ".join(action.help.split())
            if name == "--global-batch-size":
                assert "global batch" in help_text and "per rank" not in help_text, command
            elif name == "--batch-size":
                assert "per-rank batch" in help_text and "per rank" in help_text, command
                assert "TorchRec's batch_size" in help_text and "global" not in help_text
            else:
                pytest.fail(f"{command} {name}: a batch flag that says neither per rank nor global")
    assert seen["steptime --batch-size"]  # per rank, as TorchRec's planner
    for command in ("demo", "collect", "pool"):
        assert f"{command} --global-batch-size" in seen
        assert f"{command} --batch-size" not in seen


@pytest.mark.parametrize("command", ["demo", "collect", "pool"])
def test_the_old_global_batch_flag_is_refused_naming_its_new_name(command, capsys):
    argv = [command, "--batch-size", "256"] + (["--db", "x.sqlite"] if command == "collect" else [])
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--batch-size was renamed --global-batch-size" in err and "per rank" in err


def test_the_measuring_flags_say_what_they_time():
    """``--no-measure`` alone times nothing; ``--no-calibrate`` only fine-tunes nothing."""
    plan = flags(subparsers()["plan"])
    no_measure = " ".join(plan["--no-measure"].help.split())
    assert no_measure.startswith("time nothing")
    calibrate = " ".join(plan["--no-calibrate"].help.split())
    assert "--no-calibrate fine-tunes nothing, but still times the reference kernel" in calibrate
    assert "dense kernel" in calibrate and "collectives" in calibrate
    for command, parser in subparsers().items():
        for name, action in flags(parser).items():
            text = " ".join((action.help or "").split()).lower()
            if name != "--no-measure" and "calibrat" in name:
                assert "measures nothing" not in text and "measuring nothing" not in text, (
                    f"{command} {name}: only --no-measure measures nothing"
                )
    epilog = subparsers()["plan"].epilog
    assert "--no-calibrate   # the checkpoint as it is, measuring nothing" not in epilog
    assert '"global_batch_size": 2048' in epilog
