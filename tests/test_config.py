import math
import re

import pytest

from asgd.run import config
from asgd.run.config import ConfigError


def test_defaults_are_the_papers_setup():
    c = config.parse([], world_size=16)
    assert (c.hidden, c.batch, c.data) == (10000, 256, None)
    assert c.lr is None  # resolved to 3/hidden by the trainer


@pytest.mark.parametrize("argv, world, message", [
    (["--batch", "0"], 4, "--batch must be >= 1, got 0"),
    (["--hidden", "-1"], 4, "--hidden must be >= 1, got -1"),
    (["--epochs", "0"], 4, "--epochs must be >= 1, got 0"),
    (["--lr", "0"], 4, "--lr must be a positive finite number"),
    (["--lr", "-0.1"], 4, "--lr must be a positive finite number"),
    (["--lr", "nan"], 4, "--lr must be a positive finite number"),
    (["--lr", "inf"], 4, "--lr must be a positive finite number"),
    (["--classes", "1"], 4, "--classes must be >= 2"),
    (["--timeout", "-1"], 4, "--timeout must be >= 0"),
    (["--batch", "abc"], 4, "invalid int value: 'abc'"),
    (["--no-such-option"], 4, "unrecognized arguments: --no-such-option"),
    (["--test", "t.tsv"], 4, "--test needs --data"),
    ([], 1, "need at least 2 MPI ranks (1 server + 1 worker), got 1; run under mpiexec -n N with N >= 2, or give "
             "--arch p2p or --arch allreduce (they run on 1 rank)"),
    (["--servers", "4"], 3, "--servers 4 leaves no worker among 3 ranks"),
    (["--servers", "2"], 2, "--servers 2 leaves no worker among 2 ranks"),
    (["--mode", "fast"], 3, "argument --mode: invalid choice: 'fast'"),
    (["--checkpoint-every", "soon"], 3, "--checkpoint-every must be N (updates) or Ns (seconds)"),
    (["--arch", "allreduce", "--compress", "1bit"], 3, "--compress 1bit needs --arch ps"),
    (["--compress", "2bit"], 3, "argument --compress: invalid choice: '2bit'"),
    (["--target-accuracy", "0"], 3, "--target-accuracy must be in (0, 1], got 0.0"),
    (["--target-accuracy", "1.5"], 3, "--target-accuracy must be in (0, 1], got 1.5"),
    (["--target-accuracy", "nan"], 3, "--target-accuracy must be in (0, 1], got nan"),
    (["--target-loss", "0"], 3, "--target-loss must be a positive finite number, got 0.0"),
    (["--target-loss", "inf"], 3, "--target-loss must be a positive finite number, got inf"),
    (["--target-accuracy", "0.9", "--target-loss", "0.2"], 3, "give --target-accuracy or --target-loss, not both"),
    (["--target-accuracy", "0.9", "--servers", "2"], 4, "--target-accuracy needs the held-out evaluation during "
                                                         "training, which needs all of w on rank 0: use --servers 1"),
    (["--target-loss", "0.2", "--arch", "p2p", "--model-parallel", "2"], 4, "--arch p2p with --model-parallel"),
    (["--eval-every", "5", "--servers", "2"], 4, "--eval-every needs the held-out evaluation during training"),
    (["--eval-every", "often"], 3, "--eval-every must be auto, epoch, N (updates) or Ns (seconds), got 'often'"),
    (["--eval-every", "0s"], 3, "--eval-every must be positive, got '0s'"),
    (["--eval-every", "-5"], 3, "--eval-every must be positive, got '-5'"),
])
def test_bad_options_give_one_clear_message(argv, world, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        config.parse(argv, world_size=world)


@pytest.mark.parametrize("argv", [["--target-accuracy", "1"], ["--target-loss", "0.05", "--arch", "allreduce"],
                                  ["--target-accuracy", "0.9", "--model-parallel", "2", "--servers", "1"]])
def test_targets_rank_0_can_check_are_taken(argv):
    c = config.parse([*argv, "--eval-every", "0.5s"], world_size=5)
    assert (c.target_accuracy or c.target_loss) and config.eval_cadence(c.eval_every) == config.Cadence("seconds", 0.5)
    assert config.eval_cadence("200") == config.Cadence("updates", 200) and config.parse([], 3).eval_every == "auto"
    assert config.eval_cadence("epoch") == config.Cadence("epoch")


def test_values_round_trip_to_dict():
    c = config.parse(["--hidden", "100", "--lr", "0.5", "--seed", "3"], world_size=2)
    d = c.to_dict()
    assert d["hidden"] == 100 and math.isclose(d["lr"], 0.5) and d["seed"] == 3
    assert set(d) == {f.name for f in config.Config.__dataclass_fields__.values()}


@pytest.mark.parametrize("n, args, servers", [
    (8, ["--model-parallel", "2"], 2),                       # 6 workers: 3 replicas of 2
    (8, ["--model-parallel", "4"], 4),                       # 4 workers: 1 replica
    (9, ["--model-parallel", "2"], 1),                       # 8 workers already divide
    (8, [], 1),
    (8, ["--model-parallel", "2", "--servers", "3"], None),  # given: kept, and refused
    (8, ["--arch", "allreduce", "--model-parallel", "2"], 1),
])
def test_servers_default_to_whole_replicas(n, args, servers):
    """mpiexec -n 8 python -m asgd.train --model-parallel 2 runs: without --servers, the
    fewest servers that leave a multiple of K workers; a given --servers is never changed."""
    if servers is None:
        with pytest.raises(config.ConfigError, match="does not divide the 5 workers"):
            config.parse(args, n)
    else:
        assert config.parse(args, n).servers == servers
