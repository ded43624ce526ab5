"""asgd.perf.analytic: the paper's equations (section 3, eq. 1-9; section 5.3, eq. 12 and the
updated total), the extensions past it (MVA, cores, caches, interpolation), and the
calibrated-parameter prediction (Params, predict).

Every expected value is worked out by hand below (the arithmetic is in the comments) and
written as a literal: nothing is computed by calling, or re-implementing, the code under
test. No MPI, no subprocesses.
"""

import dataclasses
import json
import math

import pytest

from asgd.perf import analytic as pm
from asgd.core.target import EVAL_BUDGET
from asgd.core.wire import DOUBLE, PUSH_HEADER
from asgd.perf import architectures as arch
from asgd.perf.analytic import Params, Run, Table1
from asgd.perf.architectures import predict


def approx(x):
    return pytest.approx(x, rel=1e-12)


# -- Part 1: the paper's equations ------------------------------------------------------

# The paper's setup at w = 4: d/w = n = 4096 points per worker, n_w = 50002 (hidden 10000,
# 2 features, 2 classes), b = 256, so n/b = 16 batches per worker per pass.
T = Table1(w=4, b=256, n_f=2, n_w=50002, d=16384, epoch=2, c_p=1e-5, c_b=2e-4, c_u=3e-4,
           r_d=3e-8, r_m=1e-10, r_net=2e-10)
N = 4096  # d / w


def test_eq1_processing():
    # c_p n = 1e-5 x 4096
    assert pm.T_processing(T, N) == approx(0.04096)


def test_eq2_update():
    # c_b n / b = 2e-4 x 4096 / 256 = 2e-4 x 16
    assert pm.T_update(T, N) == approx(0.0032)


def test_eq3_computation():
    # 0.04096 + 0.0032
    assert pm.T_computation(T, N) == approx(0.04416)


def test_eq4_is_eq3_with_c_b_equal_c_p():
    t = dataclasses.replace(T, c_b=1e-5)
    # c_p n (1 + 1/b) = 1e-5 x 4096 x 257/256 = 0.04096 + 0.00016
    assert pm.T_computation(t, N) == approx(0.04112)


def test_eq5_disk_default_point_bytes_is_8_n_f():
    assert T.bytes_per_point == 16  # 8 x n_f
    # r_d x 8 n_f x n = 3e-8 x 16 x 4096 = 3e-8 x 65536
    assert pm.T_disk(T, N) == approx(0.00196608)


def test_eq5_disk_with_point_bytes_from_a_text_file():
    t = dataclasses.replace(T, point_bytes=43.0)
    assert t.bytes_per_point == 43.0
    # 3e-8 x 43 x 4096 = 3e-8 x 176128
    assert pm.T_disk(t, N) == approx(0.00528384)


def test_eq6_memory():
    # 8 n (r_m n_f + 2 r_m n_w / b) = 32768 x (2e-10 + 2e-10 x 50002 / 256)
    #                               = 32768 x (2e-10 + 3.906406250e-8) = 32768 x 3.926406250e-8
    assert pm.T_memory(T, N) == approx(0.0012866048)


def test_eq7_send():
    # r_net x 8 n_w x n / b = 2e-10 x 400016 x 16 = 2e-10 x 6400256
    assert pm.T_send(T, N) == approx(0.0012800512)


def test_eq8_network():
    # n/b (16 r_net n_w + w c_u) = 16 x (16 x 2e-10 x 50002 + 4 x 3e-4)
    #                            = 2 x 0.0012800512 + 0.0192
    assert pm.T_network(T, N) == approx(0.0217601024)


def test_eq9_total_computation_bound():
    # T_disk(4096) + 2 max(T_network, T_computation + T_memory)
    #   = 0.00196608 + 2 max(0.0217601024, 0.04416 + 0.0012866048 = 0.0454466048)
    #   = 0.00196608 + 0.0908932096
    assert pm.T_total(T) == approx(0.0928592896)


def test_eq9_total_with_a_text_file():
    # 0.00528384 + 0.0908932096
    assert pm.T_total(dataclasses.replace(T, point_bytes=43.0)) == approx(0.0961770496)


def test_eq9_total_network_bound():
    t = dataclasses.replace(T, c_u=3e-3)
    # T_network = 16 x (1.600064e-4 + 4 x 3e-3) = 0.0025601024 + 0.192 = 0.1945601024 > 0.0454466048
    # T_total = 0.00196608 + 2 x 0.1945601024
    assert pm.T_network(t, N) == approx(0.1945601024)
    assert pm.T_total(t) == approx(0.3910862848)


def test_eq12_disk_new():
    # w T_disk(n w) = 4 x 3e-8 x 16 x 16384 = 4 x 0.00786432
    assert pm.T_disk_new(T, 4, N) == approx(0.03145728)


@pytest.mark.parametrize("w, expected", [
    (1, 0.00196608),    # 1 x T_disk(4096)
    (2, 0.00786432),    # 4 x 0.00196608
    (4, 0.03145728),    # 16 x 0.00196608
    (8, 0.12582912),    # 64 x 0.00196608
    (16, 0.50331648),   # 256 x 0.00196608
])
def test_eq12_grows_as_w_squared_for_a_fixed_share(w, expected):
    assert pm.T_disk_new(T, w, N) == approx(expected)


def test_total_new_above_the_floor_is_eq9_with_the_sequential_read():
    # T_disk_new(4, 4096) + 2 max(0.0454466048, 0.01) = 0.03145728 + 0.0908932096
    assert pm.T_total_new(T, 0.01) == approx(0.1223504896)


def test_total_new_computation_phase_is_a_floor():
    # the least achievable computation phase, 1 s, exceeds eq. 9's per-pass 0.0454466048 s:
    # max, not the printed min: 0.03145728 + 2 x 1.0
    assert pm.T_total_new(T, 1.0) == approx(2.03145728)
    # a larger floor only ever adds: monotone in T_computation_phase
    assert pm.T_total_new(T, 0.0) == approx(0.1223504896)
    assert pm.T_total_new(T, 0.0454466048) == approx(0.1223504896)


# -- Part 2: the extensions -------------------------------------------------------------

@pytest.mark.parametrize("think, service, X", [
    (3.0, [1.0], 0.25),          # 1 / (3 + 1)
    (0.3, [0.2, 0.5], 1.0),      # 1 / (0.3 + 0.2 + 0.5)
    (0.0, [0.125], 8.0),         # 1 / 0.125
])
def test_mva_one_customer(think, service, X):
    got, R = pm.mva(1, think, service)
    assert got == approx(X)
    assert R == [approx(s) for s in service]  # nobody ahead: response = service


@pytest.mark.parametrize("customers", [1, 2, 3, 7, 50])
def test_mva_single_station_no_think_runs_at_1_over_S(customers):
    # Z = 0: the server is never idle; Q(n) = n so R(n) = n S and X = n / (n S) = 1/S = 4
    X, R = pm.mva(customers, 0.0, [0.25])
    assert X == approx(4.0)
    assert R == [approx(0.25 * customers)]


def test_mva_no_overlap_one_station_hand_values():
    # Z = 2, S = 1.  n=1: R=1, X=1/3, Q=1/3.  n=2: R=4/3, X=2/(10/3)=0.6, Q=0.8.
    #                n=3: R=1.8, X=3/3.8=15/19.
    X, R = pm.mva(2, 2.0, [1.0])
    assert X == approx(0.6) and R == [approx(4 / 3)]
    X, R = pm.mva(3, 2.0, [1.0])
    assert X == approx(15 / 19) and R == [approx(1.8)]


def test_mva_no_overlap_two_stations_hand_values():
    # Z = 1, S = [1, 0.5].
    #   n=1: R=[1, 0.5],  X=1/2.5=0.4,        Q=[0.4, 0.2]
    #   n=2: R=[1.4, 0.6], X=2/(1+2)=2/3,     Q=[14/15, 0.4]
    #   n=3: R=[29/15, 0.7], sum=79/30, X=3/(109/30)=90/109
    X, R = pm.mva(2, 1.0, [1.0, 0.5])
    assert X == approx(2 / 3) and R == [approx(1.4), approx(0.6)]
    X, R = pm.mva(3, 1.0, [1.0, 0.5])
    assert X == approx(90 / 109) and R == [approx(29 / 15), approx(0.7)]


def test_mva_overlap_hand_values_think_dominates():
    # Z = 4, S = 1; a cycle is max(Z, R).
    #   n=1: R=1, cycle 4, X=0.25, Q=0.25
    #   n=2: R=1.25, cycle 4, X=0.5, Q=0.625
    #   n=3: R=1.625, cycle 4, X=0.75
    X, R = pm.mva(1, 4.0, [1.0], overlap=True)
    assert X == approx(0.25) and R == [approx(1.0)]
    X, R = pm.mva(2, 4.0, [1.0], overlap=True)
    assert X == approx(0.5) and R == [approx(1.25)]
    X, R = pm.mva(3, 4.0, [1.0], overlap=True)
    assert X == approx(0.75) and R == [approx(1.625)]
    # without overlap the same workers are slower: n=2 is 2/(4+1.2)=5/13 (n=1: R=1, X=0.2, Q=0.2)
    X, R = pm.mva(2, 4.0, [1.0])
    assert X == approx(5 / 13) and R == [approx(1.2)]


def test_mva_overlap_hand_values_response_dominates():
    # Z = 0.5, S = 1: the response (>= 1) always exceeds the think time, so a cycle is R.
    #   n=1: R=1, X=1, Q=1.  n=2: R=2, X=1, Q=2.  n=3: R=3, X=1.
    X, R = pm.mva(2, 0.5, [1.0], overlap=True)
    assert X == approx(1.0) and R == [approx(2.0)]
    X, R = pm.mva(3, 0.5, [1.0], overlap=True)
    assert X == approx(1.0) and R == [approx(3.0)]


def test_mva_no_customers():
    assert pm.mva(0, 1.0, [0.5]) == (0.0, [0.0])


NETWORKS = [(2.0, [1.0]), (1.0, [1.0, 0.5]), (0.0, [0.3]), (5.0, [0.1, 0.4, 0.2]), (1e-3, [2e-5]),
            (1.0, [0.5, 0.25])]


@pytest.mark.parametrize("think, service", NETWORKS)
def test_mva_no_overlap_monotone_and_bounded(think, service):
    Xs = [pm.mva(n, think, service)[0] for n in range(1, 41)]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(Xs, Xs[1:]))
    assert all(X <= 1 / max(service) * (1 + 1e-12) for X in Xs)
    assert all(X <= n / (think + sum(service)) * (1 + 1e-12) for n, X in enumerate(Xs, 1))


# With overlap, a cycle is max(think, response): an approximation that on its own would let
# Z = 2, S = [1] reach X(3) = 3/2.5 = 1.2 > 1/S; mva caps it at the busiest station's 1/S.
def test_mva_overlap_bounded_by_the_busiest_server():
    for think, service in NETWORKS:
        for n in range(1, 41):
            X = pm.mva(n, think, service, overlap=True)[0]
            assert X <= 1 / max(service) * (1 + 1e-12), (think, service, n, X)


# Z = 1, S = [0.5, 0.25]: uncapped, X(2) = 32/17 = 1.882 > X(3) = 204/109 = 1.872; mva keeps
# throughput non-decreasing in workers.
def test_mva_overlap_monotone_in_customers():
    for think, service in NETWORKS:
        Xs = [pm.mva(n, think, service, overlap=True)[0] for n in range(1, 41)]
        assert all(b >= a * (1 - 1e-12) for a, b in zip(Xs, Xs[1:])), (think, service, Xs)


def test_saturation_workers():
    assert pm.saturation_workers(3.0, 1.0) == approx(4.0)     # (3 + 1) / 1
    assert pm.saturation_workers(0.9, 0.1) == approx(10.0)    # (0.9 + 0.1) / 0.1
    assert pm.saturation_workers(0.0, 0.5) == approx(1.0)
    assert pm.saturation_workers(1.0, 0.0) == math.inf


def test_saturation_is_where_mva_flattens():
    # Z = 9, S = 1: knee at 10 workers; well past it MVA is within 5% of 1/S, well before it
    # each worker still adds nearly 1/(Z+S) = 0.1
    assert pm.saturation_workers(9.0, 1.0) == approx(10.0)
    assert pm.mva(40, 9.0, [1.0])[0] > 0.95
    assert pm.mva(2, 9.0, [1.0])[0] > 0.19


@pytest.mark.parametrize("ranks, cores, share", [
    (2, 4, 1.0), (4, 4, 1.0), (8, 4, 0.5), (6, 4, 4 / 6), (16, 2, 0.125), (0, 4, 1.0), (4.5, 4, 4 / 4.5),
])
def test_cores_shared(ranks, cores, share):
    assert pm.cores_shared(ranks, cores) == approx(share)


CACHES = {"L1d": 32768, "L2": 1048576, "L3": 33554432}


@pytest.mark.parametrize("nbytes, caches, level", [
    (1, CACHES, "L1d"),
    (32768, CACHES, "L1d"),
    (32769, CACHES, "L2"),
    (1048576, CACHES, "L2"),
    (1048577, CACHES, "L3"),
    (33554432, CACHES, "L3"),
    (33554433, CACHES, "memory"),
    (500, {"L1d": 100, "L3": 1000}, "L3"),   # no L2 reported: the next one up
    (5, {}, "memory"),
])
def test_cache_level(nbytes, caches, level):
    assert pm.cache_level(nbytes, caches) == level


def test_working_set_small_case():
    # batch 4, n_w 10, hidden 5, n_f 2: rows = min(4, 2500000 // 40) = 4
    #   2 x 8 x 10 (w, Delta-w) + 8 x 3 x 4 (batch X and y) + 8 x 4 x 5 (h) = 160 + 96 + 160
    assert pm.working_set_bytes(4, 10, 5, n_f=2) == 416
    # n_f 5: the batch part is 8 x 6 x 4 = 192
    assert pm.working_set_bytes(4, 10, 5, n_f=5) == 512


def test_working_set_the_papers_network_is_past_l2():
    # batch 256, n_w 50002, hidden 10000: w and Delta-w alone are 800032 bytes; the h block
    # (about 2.2-2.5 MB) takes the total past a 1 MiB L2, within a 32 MiB L3
    nbytes = pm.working_set_bytes(256, 50002, 10000)
    assert 3_000_000 < nbytes < 3_300_000
    assert pm.cache_level(nbytes, CACHES) == "L3"


# The kernel's sample block (kernels._block_rows): at most 32 rows, a multiple of 4. Hidden 100,
# batch 256: 2 x 8 x 502 + 8 x 3 x 256 + 8 x 32 x 100 = 8032 + 6144 + 25600 = 39776;
# hidden 10000, batch 256 (28 rows): 800032 + 6144 + 2240000 = 3046176.
def test_working_set_uses_the_kernels_sample_block():
    assert pm.working_set_bytes(256, 502, 100) == 39776
    assert pm.working_set_bytes(256, 50002, 10000) == 3046176


def test_interpolate_log_exact_at_table_points():
    table = {16: 2e-4, 64: 8e-4, 1024: 1.028e-2}
    for x, y in table.items():
        assert pm.interpolate_log(table, x) == approx(y)


def test_interpolate_log_geometric_mean_midway():
    # 4 is midway between 2 and 8 in log x: sqrt(3 x 12) = 6
    assert pm.interpolate_log({2: 3.0, 8: 12.0}, 4) == approx(6.0)
    # 100 midway between 10 and 1000: sqrt(1 x 100) = 10
    assert pm.interpolate_log({10: 1.0, 1000: 100.0}, 100) == approx(10.0)
    # a power law y = x^2 is reproduced exactly between its points: 20^2
    assert pm.interpolate_log({10: 100.0, 40: 1600.0}, 20) == approx(400.0)
    # constant stays constant
    assert pm.interpolate_log({1: 5.0, 100: 5.0}, 10) == approx(5.0)
    # three points: between the 2nd and 3rd, 16 midway between 8 and 32: sqrt(12 x 48) = 24
    assert pm.interpolate_log({2: 3.0, 8: 12.0, 32: 48.0}, 16) == approx(24.0)


def test_interpolate_log_extrapolates_linearly_in_x():
    table = {2: 3.0, 8: 12.0, 32: 100.0}
    assert pm.interpolate_log(table, 1) == approx(1.5)     # 3 x 1/2
    assert pm.interpolate_log(table, 0.5) == approx(0.75)  # 3 x 0.5/2
    assert pm.interpolate_log(table, 64) == approx(200.0)  # 100 x 64/32
    assert pm.interpolate_log(table, 96) == approx(300.0)  # 100 x 96/32
    assert pm.interpolate_log({10: 7.0}, 30) == approx(21.0)  # one point: proportional


# -- Part 3: calibrated parameters and the prediction -----------------------------------

# A tiny hand-made calibration. Hidden 100 -> n_w = 100 x 3 + 2 x 101 = 502;
# hidden 400 -> n_w = 1200 + 802 = 2002. The hidden-400 step is 4x the hidden-100 one, so
# hidden 200 (their geometric mean) is 2x. Between batch 16 and 1024 the hidden-100 step
# rises by 1008 x 1e-5: c_p = 1e-5 s/point.
STEP_S = {100: {16: 2e-4, 64: 8e-4, 1024: 1.028e-2}, 400: {16: 8e-4, 64: 3.2e-3, 1024: 4.112e-2}}


# one rank's start: imports, then numba's cache loads of the parsers and the kernels
STARTUP = {"imports_wall_s": 0.5, "imports_cpu_s": 0.4, "parsers_wall_s": 0.1, "parsers_cpu_s": 0.08,
           "kernels_wall_s": 0.2, "kernels_cpu_s": 0.16}


def make_params(**kw) -> Params:
    p = Params(cores=4, effective_cores={1: 1.0, 4: 4.0}, startup=dict(STARTUP),
               step_s={h: dict(t) for h, t in STEP_S.items()},
               eval_s_per_point={100: 1e-6, 400: 4e-6},
               worker_msg_s={502: 1e-5, 2002: 4e-5},      # slope 2e-8 s/weight
               server_update_s={502: 2e-5, 2002: 5e-5},   # slope 2e-8
               round_trip_s={502: 6e-5, 2002: 1.2e-4},    # slope 4e-8
               # 1e-6 + 2e-9 b from 64 KiB up (slope 2e-9 s/byte); 8 bytes: latency, left out of the fit
               pingpong_s={262144: 5.25288e-4, 8: 1e-6, 65536: 1.32072e-4, 131072: 2.63144e-4},
               read_s_per_byte={"tsv": 2e-8, "npy": 1e-9},
               select_s_per_point={"sequential": 1e-7, "parallel": 3e-7},
               memory_s_per_byte=1e-10, bytes_per_point={"tsv": 40.0, "npy": 24.0},
               embedded_s=0.2, caches=dict(CACHES))
    return dataclasses.replace(p, **kw)


def test_params_from_dict_round_trips_through_json():
    p = make_params()
    d = json.loads(json.dumps(dataclasses.asdict(p)))
    assert set(d["step_s"]) == {"100", "400"} and set(d["step_s"]["100"]) == {"16", "64", "1024"}
    d["units"] = {"cores": "cores"}  # params.json carries more than the fields: ignored
    q = Params.from_dict(d)
    assert q == p
    assert all(isinstance(h, int) for h in q.step_s)
    assert all(isinstance(b, int) for t in q.step_s.values() for b in t)
    for table in (q.eval_s_per_point, q.worker_msg_s, q.server_update_s, q.round_trip_s, q.pingpong_s):
        assert all(isinstance(k, int) for k in table)
    assert q.read_s_per_byte == {"tsv": 2e-8, "npy": 1e-9}  # string-keyed tables stay strings
    assert q.caches == CACHES


def test_params_from_dict_defaults():
    d = json.loads(json.dumps(dataclasses.asdict(make_params())))
    del d["caches"], d["embedded_s"]
    assert d["startup"] == STARTUP
    q = Params.from_dict(d)
    assert q.caches == {} and q.embedded_s == 0.0


def old_file() -> dict:
    """make_params as params.json's "params" from calibrate before it measured both
    precisions: every table flat (float64's)."""
    d = json.loads(json.dumps(dataclasses.asdict(make_params())))
    del d["precision"], d["precisions"]
    return d


def two_precisions(float32_speedup: float) -> dict:
    """make_params as params.json's "params" from calibrate: the shared tables, and the
    per-precision ones twice, float32's every cost float64's over `float32_speedup`."""
    flat = old_file()
    f64 = {k: flat.pop(k) for k in pm.PER_PRECISION}

    def faster(t):
        return {k: faster(v) for k, v in t.items()} if isinstance(t, dict) else t / float32_speedup
    return {**flat, "precisions": {"float64": f64, "float32": faster(f64)}}


@pytest.mark.parametrize("shape", [dict(workers=4, servers=1), dict(workers=4, arch="allreduce"),
                                   dict(workers=4, mode="sync", model_parallel=2, hidden=400)])
def test_a_float32_run_is_priced_at_float32s_rates(shape):
    """Fails if the model prices a float32 run at float64's compute (or exchange) rate:
    with every float32 cost half float64's, a float32 run trains in half the time (its
    start-up and reading, shared by both, alike)."""
    p = Params.from_dict(two_precisions(2.0))
    run = Run(**{"hidden": 100, "batch": 64, "points": 4096, **shape})
    f64, f32 = predict(p, run), predict(p, dataclasses.replace(run, precision="float32"))
    assert f32.train_s == approx(f64.train_s / 2) and f32.compute_s == approx(f64.compute_s / 2)
    assert f32.init_s == approx(f64.init_s)
    assert p.table1(dataclasses.replace(run, precision="float32")).c_p == approx(p.table1(run).c_p / 2)


def test_a_params_file_from_before_both_precisions_still_predicts():
    """A float64-only params.json (its tables flat, as calibrate wrote them before) is
    float64's; a float32 run gets those rates as they are, with one PrecisionFallback
    warning that says so, and its prediction is float64's but for the bytes."""
    old = Params.from_dict(old_file())
    assert old.precision == "float64" and old.precisions == {}
    run = Run(workers=4, hidden=100, batch=64, points=4096)
    with pytest.warns(pm.PrecisionFallback, match="float64 rates only.*calibrate again"):
        f32 = predict(old, dataclasses.replace(run, precision="float32"))
    assert f32.compute_s == approx(predict(old, run).compute_s)


def test_derived_params_keep_their_change_in_every_precision():
    """A change to a per-precision table through each_precision (a testbed's round trip,
    a calibration without its crowded probes) holds at every precision at() swaps in."""
    from asgd.testbed.model import testbed_params
    p = Params.from_dict(two_precisions(2.0))
    tb = testbed_params(p, 100e6, latency_s=1e-3)
    for prec in ("float32", "float64"):
        assert tb.at(prec).round_trip_s[502] == approx(p.at(prec).round_trip_s[502] + 2e-3)
        assert tb.at(prec).link_latency_s == 1e-3


@pytest.mark.parametrize("hidden, batch, s", [
    (100, 16, 2e-4), (100, 64, 8e-4), (100, 1024, 1.028e-2), (400, 64, 3.2e-3),  # measured
    (100, 32, 4e-4),      # sqrt(2e-4 x 8e-4): 32 is midway between 16 and 64 in log
    (400, 32, 1.6e-3),    # sqrt(8e-4 x 3.2e-3)
    (200, 64, 1.6e-3),    # hidden 200 midway between 100 and 400: sqrt(8e-4 x 3.2e-3)
    (200, 32, 8e-4),      # sqrt(4e-4 x 1.6e-3)
    (100, 8, 1e-4),       # below the batches: 2e-4 x 8/16
    (100, 2048, 2.056e-2),  # above: 1.028e-2 x 2
    (800, 64, 6.4e-3),    # above the hidden sizes: 3.2e-3 x 800/400
    (50, 16, 1e-4),       # below: 2e-4 x 50/100
])
def test_params_step(hidden, batch, s):
    assert make_params().step(hidden, batch) == approx(s)


def test_per_nw_two_sizes_linear():
    p = make_params()
    t = p.worker_msg_s  # {502: 1e-5, 2002: 4e-5}
    assert p.per_nw(t, 502) == approx(1e-5)
    assert p.per_nw(t, 2002) == approx(4e-5)
    assert p.per_nw(t, 1252) == approx(2.5e-5)   # 1e-5 + 750 x 2e-8
    assert p.per_nw(t, 4002) == approx(8e-5)     # 1e-5 + 3500 x 2e-8: the line goes on
    assert p.per_nw(t, 102) == approx(2e-6)      # 1e-5 - 400 x 2e-8
    assert p.per_nw(t, 0) == 0.0                 # 1e-5 - 502 x 2e-8 = -4e-8: never negative


def test_per_nw_one_size_is_proportional():
    assert make_params().per_nw({1000: 1e-5}, 3000) == approx(3e-5)


def test_per_nw_three_sizes():
    p = make_params()
    t = {400: 4.0, 100: 1.0, 200: 3.0}  # slopes 0.02 then 0.005
    assert p.per_nw(t, 150) == approx(2.0)   # 1 + 50 x 0.02
    assert p.per_nw(t, 300) == approx(3.5)   # 3 + 100 x 0.005
    assert p.per_nw(t, 800) == approx(6.0)   # 3 + 600 x 0.005
    assert p.per_nw(t, 50) == 0.0            # 1 - 50 x 0.02 = 0


# Four sizes: n_w = 250 lies in (200, 300): 2 + 50 x 0.08 = 6.0 (not the last segment's 9.5).
def test_per_nw_four_sizes_interpolates_in_the_bracketing_segment():
    t = {100: 1.0, 200: 2.0, 300: 10.0, 400: 11.0}
    assert make_params().per_nw(t, 250) == approx(6.0)


def test_r_net_is_the_least_squares_slope_from_64_kib_up():
    assert make_params().r_net() == approx(2e-9)  # collinear points: exactly their slope
    # b / 64 KiB = 1, 2, 4 (mean 7/3), t = 3, 5, 9 e-5 (mean 17/3): Sxx = 14/3, Sxy = 28/3 (e-5),
    # slope 2e-5 per 65536 bytes = 3.0517578125e-10; the 8-byte point (latency) is left out
    p = make_params(pingpong_s={8: 1e-3, 65536: 3e-5, 131072: 5e-5, 262144: 9e-5})
    assert p.r_net() == approx(3.0517578125e-10)


def test_run_n_w():
    assert Run(workers=1, hidden=100).n_w == 502
    assert Run(workers=1, hidden=10000).n_w == 50002  # the paper's network
    assert Run(workers=1, hidden=10, features=5, classes=3).n_w == 10 * 6 + 3 * 11
    assert Run(workers=3, servers=2).ranks == 5


def test_table1_from_params():
    p = make_params()
    run = Run(workers=2, servers=1, batch=64, hidden=100, epochs=3, points=1000)
    # c_p = (1.028e-2 - 2e-4) / (1024 - 16) = 1.008e-2 / 1008 = 1e-5
    # c_b = (2e-4 - 16 x 1e-5) + worker_msg(502) = 4e-5 + 1e-5
    # c_u = server_update(502) = 2e-5; r_net = 2e-9; TSV: r_d 2e-8, 40 bytes a point
    t = p.table1(run)
    assert (t.w, t.b, t.n_f, t.n_w, t.d, t.epoch) == (2, 64, 2, 502, 1000, 3)
    assert t.c_p == approx(1e-5)
    assert t.c_b == approx(5e-5)
    assert t.c_u == approx(2e-5)
    assert t.r_d == approx(2e-8)
    assert t.r_m == approx(1e-10)
    assert t.r_net == approx(2e-9)
    assert t.point_bytes == 40.0
    tb = p.table1(dataclasses.replace(run, binary=True))
    assert tb.r_d == approx(1e-9) and tb.point_bytes == 24.0
    # hidden 400 (n_w 2002): c_p = (4.112e-2 - 8e-4) / 1008 = 4e-5; c_b = (8e-4 - 6.4e-4) + 4e-5
    t4 = p.table1(dataclasses.replace(run, hidden=400))
    assert t4.n_w == 2002 and t4.c_p == approx(4e-5) and t4.c_b == approx(2e-4) and t4.c_u == approx(5e-5)


def test_table1_c_b_never_negative():
    # a step table whose small-batch time is below 16 c_p: the fixed part is clamped at 0
    p = make_params(step_s={100: {16: 1e-4, 1024: 1.018e-2}})  # c_p = 1.008e-2/1008 = 1e-5; 1e-4 - 1.6e-4 < 0
    t = p.table1(Run(workers=2, hidden=100))
    assert t.c_b == approx(1e-5)  # 0 + worker_msg(502)


# Init: whole file 40000 bytes of TSV = 2e-8 x 40000 = 8e-4 s; 1000 training points,
# 200 held-out points in an 8000-byte file (1.6e-4 s).
FILE = dict(points=1000, test_points=200, file_bytes=40000, test_bytes=8000)


@pytest.mark.parametrize("P, C, startup", [
    # max(0.5, 0.4 P/C) + [0.1 + max(0.1, 0.08 (P-1)/C)] + [0.2 + max(0.2, 0.16 (P-1)/C)]
    (1, 4, 0.8),     # 0.5 + 0.1 + 0.2: one rank, nobody waits for a cache
    (2, 4, 1.1),     # 0.5 + (0.1 + 0.1) + (0.2 + 0.2)
    (4, 4, 1.1),     # 0.5 + (0.1 + max(0.1, 0.06)) + (0.2 + max(0.2, 0.12))
    (8, 4, 1.52),    # 0.8 + (0.1 + 0.14) + (0.2 + 0.28)
    (16, 4, 2.8),    # 1.6 + (0.1 + 0.3) + (0.2 + 0.6)
    (4, 2, 1.46),    # 0.8 + (0.1 + 0.12) + (0.2 + 0.24)
])
def test_predict_startup(P, C, startup):
    assert pm.predict_startup(STARTUP, P, C) == approx(startup)


@pytest.mark.parametrize("workers, read, startup", [
    (1, 1.8e-3, 1.1),     # P=2:  2 x (8e-4 + 1e-7 x 1000) = 2 x 9e-4
    (3, 3.6e-3, 1.1),     # P=4:  4 x 9e-4
    (7, 7.2e-3, 1.52),    # P=8:  8 x 9e-4
    (15, 1.44e-2, 2.8),   # P=16: 16 x 9e-4
])
def test_predict_init_sequential_reads_grow_linearly_in_ranks(workers, read, startup):
    got = pm.predict_init(make_params(), Run(workers=workers, servers=1, reader="sequential", **FILE))
    assert got["read_s"] == approx(read)
    assert got["startup_s"] == approx(startup)  # see test_predict_startup
    assert got["init_s"] == approx(read + startup)


@pytest.mark.parametrize("workers, cores, read, startup", [
    # the parse work: 8e-4 (file) + 1.6e-4 (held-out file) + 3e-7 x 1200 (shuffle) = 1.32e-3,
    # over min(P, C) ranks
    (1, 0, 6.6e-4, 1.1),    # P=2, C=4: / 2
    (3, 0, 3.3e-4, 1.1),    # P=4, C=4: / 4
    (7, 0, 3.3e-4, 1.52),   # P=8, C=4: / 4, no faster past the cores
    (3, 2, 6.6e-4, 1.46),   # P=4, run.cores=2: / 2 (and the startup of 4 ranks on 2 cores)
])
def test_predict_init_parallel_divides_by_min_ranks_cores(workers, cores, read, startup):
    got = pm.predict_init(make_params(), Run(workers=workers, servers=1, reader="parallel", cores=cores, **FILE))
    assert got["read_s"] == approx(read)
    assert got["startup_s"] == approx(startup)
    assert got["init_s"] == approx(read + startup)


def test_predict_init_parallel_binary():
    # .npy at 1e-9 s/byte: 4e-5 + 8e-6 + 3.6e-4 = 4.08e-4, over 4 ranks
    got = pm.predict_init(make_params(), Run(workers=3, reader="parallel", binary=True, **FILE))
    assert got["read_s"] == approx(1.02e-4)


@pytest.mark.parametrize("workers, read", [(1, 0.2), (3, 0.2), (7, 0.4), (15, 0.8)])
def test_predict_init_embedded(workers, read):
    # no file: each rank generates the problem, 0.2 s, and P ranks share 4 cores: 0.2 x max(1, P/4)
    got = pm.predict_init(make_params(), Run(workers=workers, servers=1, points=1000))
    assert got["read_s"] == approx(read)


# Training. 3 workers on 960 points: a share of 320, batch 64 -> 5 steps each, 15 updates.
#   think Z = step(100, 64) + worker_msg(502) = 8e-4 + 1e-5 = 8.1e-4 s
#   c_u = server_update(502) = 2e-5 s; evaluation 100 held-out points x 1e-6 s = 1e-4 s
TRAIN = dict(workers=3, servers=1, hidden=100, batch=64, points=960, test_points=100, epochs=1)


def test_an_asynchronous_p2p_peer_pays_one_wait_and_its_owners_pay_their_bytes():
    # 3 peers, shards of k = 168 of n_w 502: the peer's one wait for all its owners
    # (worker_msg(168) = 3.32e-6) and, for each of the 3 shards, its owner's add and reply's
    # copy: 4 passes x 8 bytes x 168 x 1e-10 s/byte. No c_u(168) = 1.332e-5: that is a
    # server's that sleeps between pushes (the probe's), an owner is polled in its peer's loop
    d = pm.predict_train(make_params(), Run(arch="p2p", **{**TRAIN, "servers": 3}))
    assert d["think_s"] == approx(8e-4 + 3.32e-6 + 3 * 4 * 8 * 168 * 1e-10)
    assert d["c_u_s"] == approx(4 * 8 * 168 * 1e-10)


def test_a_crowded_p2p_peer_pays_the_workers_share_of_the_contended_push_pull():
    # 4 peers on 2 cores, k = 126: contended_update_s[4](126) = 2e-4 for worker_msg(126) +
    # c_u(126) = 2.48e-6 + 1.248e-5: the worker's share 2e-4 x 2.48 / 14.96; each owner's push
    # its 4 passes x 8 bytes x 126 x 1e-10 as uncrowded. Cores' worth 2: X = 2 / (step + msg)
    p = make_params(contended_update_s={4: {502: 2e-4, 2002: 2e-4}})
    d = pm.predict_train(p, Run(arch="p2p", cores=2, **{**TRAIN, "workers": 4, "servers": 4, "points": 1024}))
    msg = 2e-4 * 2.48e-6 / (2.48e-6 + 1.248e-5) + 4 * 4 * 8 * 126 * 1e-10
    assert d["bound"] == "cores" and d["updates_per_s"] == approx(2 / (8e-4 + msg))


@pytest.mark.parametrize("arch_, K, kind", [("p2p", 1, "p2p"), ("ps", 1, "async"), ("ps", 2, "replica")])
def test_a_crowded_asynchronous_update_waits_as_the_probe_of_whom_it_waits_on(arch_, K, kind):
    # a p2p peer waits on owners that compute (served when their ranks run): p2p's probe's turns;
    # a ps worker on a server that sleeps and wakes ahead of them: the asynchronous probe's
    asked = []
    run = Run(arch=arch_, cores=2, model_parallel=K, **{**TRAIN, "workers": 4, "servers": 4 if arch_ == "p2p" else 2})
    pm.predict_train(make_params(), run, lambda p, k, *args: asked.append(k) or 0.0)
    assert asked == [kind] and pm.async_crowding_kind(arch_, K) == kind


def test_predict_train_cpu_bound_past_the_cores():
    # 4 ranks on 2 cores: X = C / (Z + S c_u) = 2 / 8.3e-4 = 2409.638554216867... updates/s
    # (MVA alone: nearly 3 / 8.1e-4 = 3703.7, more than the cores can give)
    d = pm.predict_train(make_params(), Run(cores=2, **TRAIN))
    assert d["bound"] == "cores"
    assert d["updates"] == 15
    assert d["think_s"] == approx(8.1e-4)
    assert d["c_u_s"] == approx(2e-5)
    assert d["updates_per_s"] == approx(2409.6385542168674)
    assert d["evaluate_s"] == approx(1e-4)
    # 15 / X = 15 x 8.3e-4 / 2 = 6.225e-3, plus 1e-4 of evaluation
    assert d["train_s"] == approx(6.325e-3)
    # busy ranks: 3 + X c_u = 3 + 4e-5 / 8.3e-4 = 3.048192771084337; compute = 5 steps x 8e-4
    # stretched by busy / 2 cores: 2e-3 x 3.048192771084337
    assert d["compute_s"] == approx(6.096385542168675e-3)
    assert d["comm_s"] == approx(1.286144578313253e-4)   # 6.225e-3 - 6.0963855e-3
    assert d["knee_workers"] == approx(41.5)  # (8.1e-4 + 2e-5) / 2e-5


def test_predict_train_worker_bound_with_a_tiny_c_u():
    p = make_params(server_update_s={502: 1e-9, 2002: 1e-9}, round_trip_s={502: 2e-9, 2002: 2e-9})
    d = pm.predict_train(p, Run(**TRAIN))  # 4 ranks on 4 cores
    assert d["bound"] == "workers"
    # each worker at its own pace: X -> w / Z = 3 / 8.1e-4 = 3703.7037...
    assert d["updates_per_s"] <= 3 / 8.1e-4
    assert d["updates_per_s"] == pytest.approx(3703.7037037037035, rel=1e-5)
    assert d["compute_s"] == approx(4e-3)     # 5 x 8e-4: every rank has a core
    assert d["comm_s"] == pytest.approx(5e-5, rel=1e-3)  # 15 x 8.1e-4 / 3 - 4e-3


def test_predict_train_server_bound():
    # c_u = 1e-3 > Z: the one server runs flat out, X = 1 / c_u (MVA with overlap: n=1 R=1e-3,
    # cycle 1e-3, X=1000, Q=1; n=2 R=2e-3, X=1000; n=3 R=3e-3, X=1000; no extra latency)
    p = make_params(server_update_s={502: 1e-3, 2002: 1e-3}, round_trip_s={502: 6e-5, 2002: 6e-5})
    d = pm.predict_train(p, Run(**TRAIN, eval_every="epoch"))   # (auto's budget would pay for 7 in 15 ms)
    assert d["bound"] == "server"
    assert d["updates_per_s"] == approx(1000.0)
    assert d["train_s"] == approx(0.0151)  # 15 / 1000 + 1e-4


def test_predict_train_one_worker_async_vs_sync():
    run = Run(workers=1, servers=1, hidden=100, batch=64, points=320, test_points=100, epochs=1)
    # latency = round_trip(502) - c_u = 6e-5 - 2e-5 = 4e-5
    # async: the exchange (4e-5 + 2e-5) hides behind the next step: X = 1 / 8.1e-4
    d = pm.predict_train(make_params(), run)
    assert d["updates_per_s"] == approx(1 / 8.1e-4)
    # sync: the worker waits for it: X = 1 / (8.1e-4 + 4e-5 + 2e-5) = 1 / 8.7e-4
    d = pm.predict_train(make_params(), dataclasses.replace(run, mode="sync"))
    assert d["updates_per_s"] == approx(1 / 8.7e-4)


# S shard servers: every update visits each, so the busiest station's demand is c_u and the
# asymptotic-bound knee is (Z + S c_u) / c_u.
def test_predict_train_knee_with_two_servers():
    # S=2: each shard has ceil(502/2) = 251 weights.
    #   Z = 8e-4 + 2 x worker_msg(251) = 8e-4 + 2 x (1e-5 - 251 x 2e-8 = 4.98e-6) = 8.0996e-4
    #   c_u = server_update(251) = 2e-5 - 251 x 2e-8 = 1.498e-5
    #   knee = (8.0996e-4 + 2 x 1.498e-5) / 1.498e-5 = 8.3992e-4 / 1.498e-5 = 56.0694259012016...
    d = pm.predict_train(make_params(), Run(**{**TRAIN, "servers": 2}))
    assert d["think_s"] == approx(8.0996e-4) and d["c_u_s"] == approx(1.498e-5)
    assert d["knee_workers"] == approx(56.06942590120160)


# Extension e: where links are the limit (link_s), a server's link in and out are two
# stations crossed by all S shards of an update at once; the worker's own link carries all
# S shards each way, 2 (S - 1) shard times more than those stations.
def test_predict_train_with_links_that_are_the_limit():
    t = 0.05                                          # s per 251-weight shard on a link, one way
    p = make_params(cores=128, effective_cores={1: 1.0, 128: 128.0}, link_s={251: t, 502: 2 * t})
    c_u, rtt = p.per_nw(p.server_update_s, 251), p.per_nw(p.round_trip_s, 251)
    one = pm.predict_train(p, Run(**{**TRAIN, "workers": 1, "servers": 2, "overlap": "on"}))
    # a lone worker: its step hides behind the exchange, rtt - c_u + 2 t + 2 c_u + 2 t (one station each)
    assert one["updates_per_s"] == approx(1 / (rtt + c_u + 4 * t))
    # --overlap auto (the default): that exchange lasts over 8 steps, so the worker waits for it
    auto = pm.predict_train(p, Run(**{**TRAIN, "workers": 1, "servers": 2}))
    assert auto["updates_per_s"] == approx(1 / (auto["think_s"] + rtt + c_u + 4 * t))
    many = pm.predict_train(p, Run(**{**TRAIN, "workers": 64, "servers": 2}))
    assert 0.95 / t <= many["updates_per_s"] <= 1 / t   # the servers' links: one shard time per update
    assert many["knee_workers"] == approx((many["think_s"] + 2 * c_u + t) / t + 1)
    # the round trip and params.json keep it: a JSON round trip gives the same Params
    assert Params.from_dict(json.loads(json.dumps(dataclasses.asdict(p)))) == p


def test_mva_with_transit_below_service_and_caps():
    """A station a customer crosses faster than it holds the station's capacity (a token
    bucket's burst): no time at all while it is idle, yet at most 1 / s cycles/s; a cap
    bounds the rate without a queue."""
    X1, R1 = pm.mva(1, 0.010, [0.004], overlap=True, transit_s=[0.0])
    assert X1 == approx(100.0) and R1 == [0.0]                 # think-bound, the link costs nothing
    X, _ = pm.mva(8, 0.010, [0.004], overlap=True, transit_s=[0.0])
    assert X == approx(250.0)                                  # 1 / 0.004: the station's capacity
    assert pm.mva(8, 0.010, [0.004], overlap=True)[0] == approx(250.0)
    assert pm.mva(1, 0.010, [0.004], transit_s=[0.001])[0] == approx(1 / 0.011)
    assert pm.mva(1, 0.010, [0.004], overlap=True, cap_s=[0.02])[0] == approx(50.0)


def test_predict_train_with_messages_that_fit_the_links_burst():
    t = 0.05                                          # s per 251-weight shard on a link, one way
    p = make_params(cores=128, effective_cores={1: 1.0, 128: 128.0}, link_s={251: t, 502: 2 * t}, link_burst_s=1.0)
    one = pm.predict_train(p, Run(**{**TRAIN, "workers": 1, "servers": 2}))
    # its own link carries both shards: 1 / (2 t), though the step and the round trip are far shorter
    assert one["updates_per_s"] == approx(1 / (2 * t)) and one["bound"] == "worker link"
    many = pm.predict_train(p, Run(**{**TRAIN, "workers": 64, "servers": 2}))
    assert many["updates_per_s"] == approx(1 / t)     # the servers' links, full
    no_burst = pm.predict_train(dataclasses.replace(p, link_burst_s=0.0), Run(**{**TRAIN, "workers": 1, "servers": 2}))
    assert no_burst["updates_per_s"] < 0.6 * one["updates_per_s"]


def test_predict_total_is_init_plus_train():
    p = make_params()
    pr = predict(p, Run(cores=2, **TRAIN))
    # embedded (no file), P=4 on 2 cores: startup 1.46 (test_predict_startup), generate 0.2 x 2
    assert pr.init_s == approx(1.86)
    assert pr.train_s == approx(6.325e-3)
    assert pr.total_s == approx(1.866325)
    assert pr.compute_s == approx(6.096385542168675e-3)
    assert pr.detail["bound"] == "cores" and pr.detail["startup_s"] == approx(1.46)
    d = pr.as_dict()
    assert d["total_s"] == approx(1.866325) and d["detail"]["updates"] == 15


def test_predict_with_a_file():
    pr = predict(make_params(), Run(reader="sequential", **{**TRAIN, **FILE, "points": 960}))
    # init: startup 1.1 + 4 x (8e-4 + 1e-7 x 960) = 1.1 + 4 x 8.96e-4 = 1.103584
    assert pr.init_s == approx(1.103584)
    assert pr.total_s == approx(pr.init_s + pr.train_s)


@pytest.mark.parametrize("run, message", [
    (Run(workers=2, servers=0), "at least one server"),
    (Run(workers=0, servers=1), "at least one server and one worker"),
    (Run(workers=2, reader="mmap"), "unknown reader 'mmap'"),
])
def test_predict_rejects(run, message):
    with pytest.raises(ValueError, match=message):
        predict(make_params(), run)


# -- measured core sharing and crowded messaging ----------------------------------------

def test_cores_worth_is_linear_between_measured_counts_and_flat_beyond():
    p = make_params(cores=2, effective_cores={1: 1.0, 2: 1.9, 5: 1.8})
    assert p.cores_worth(2) == approx(1.9)
    assert p.cores_worth(3) == approx(1.8666666666666667)   # 1.9 + (1.8 - 1.9) x 1/3
    assert p.cores_worth(9) == approx(1.8)                  # beyond the largest count
    assert p.parallelism(3) == approx(1.8666666666666667)  # the calibrated machine
    # another machine of 8 cores: min(9, 8) x the calibrated per-core worth 1.9 / 2
    assert p.parallelism(9, cores=8) == approx(7.6)


def test_contended_interpolates_in_ranks_then_n_w():
    p = make_params(contended_update_s={3: {100: 1e-3, 200: 2e-3}, 5: {100: 3e-3, 200: 4e-3}})
    assert p.contended(4, 150) == approx(2.5e-3)   # (1.5e-3 at 3 ranks + 3.5e-3 at 5) / 2
    assert p.contended(9, 100) == approx(3e-3)     # beyond 5 ranks: flat
    assert p.contended(2, 200) == approx(2e-3)     # below 3 ranks: flat


def test_predict_train_crowded_uses_the_contended_messaging_cost():
    # 4 ranks on 2 cores, contended push/pull 1e-4 s per update at 502 weights:
    # X = 2 / (step 8e-4 + 1 x 1e-4) = 2222.222... updates/s; 15 updates: 6.75e-3 s + 1e-4 evaluation
    p = make_params(contended_update_s={3: {502: 1e-4, 2002: 1e-4}})
    d = pm.predict_train(p, Run(cores=2, **TRAIN))
    assert d["bound"] == "cores"
    assert d["updates_per_s"] == approx(2222.222222222222)
    assert d["train_s"] == approx(6.85e-3)


def test_r_d_per_reader_and_format_or_flat():
    nested = make_params(read_s_per_byte={"sequential": {"tsv": 2e-8, "npy": 1e-9},
                                          "parallel": {"tsv": 3e-8, "npy": 2e-9}})
    assert nested.r_d("parallel", "tsv") == 3e-8 and nested.r_d("sequential", "npy") == 1e-9
    assert make_params().r_d("parallel", "tsv") == 2e-8  # a flat [format] table serves both readers


def test_extrapolate_linear():
    t = {1: 0.5, 3: 1.5, 9: 3.0}
    assert pm.extrapolate_linear(t, 3) == approx(1.5)
    assert pm.extrapolate_linear(t, 5) == approx(2.0)     # 1.5 + 1.5 x 2/6
    assert pm.extrapolate_linear(t, 17) == approx(5.0)    # 3.0 + 0.25 x 8, the last segment's slope
    assert pm.extrapolate_linear(t, 0) == approx(0.0)     # 0.5 - 0.5 x 1, the first segment's
    assert pm.extrapolate_linear({4: 2.0}, 9) == 2.0


def test_an_exchange_round_between_probed_rank_counts_is_geometric():
    """Between two probes, the log of a round is linear in the ranks; beyond them, and at a
    probe, the rounds are as extrapolate_linear's."""
    t = {2: 0.01, 3: 0.1, 5: 1.6, 9: 2.0}
    assert pm.interpolate_geometric(t, 4) == approx(0.4)          # sqrt(0.1 x 1.6), not 0.85
    assert pm.interpolate_geometric(t, 7) == approx(math.sqrt(1.6 * 2.0))
    assert pm.interpolate_geometric(t, 3) == approx(0.1)
    assert pm.interpolate_geometric(t, 17) == approx(pm.extrapolate_linear(t, 17)) == approx(2.8)
    assert pm.interpolate_geometric(t, 1) == approx(pm.extrapolate_linear(t, 1))
    assert pm.interpolate_geometric({2: 0.0, 4: 1.0}, 3) == approx(0.5)   # no log of 0: linear
    n = 1000
    p = make_params(exchange_s={"ring": {P: {n: v} for P, v in t.items()}})
    assert p.exchange("ring", 4, n) == approx(0.4) and p.exchange("ring", 12, n) == approx(2.3)


def test_predict_init_uses_the_measured_job_startup():
    # measured start-up of 2 and 6 ranks: 1.0 and 3.0 s; 4 ranks (3 workers + 1 server): 2.0 s,
    # then the embedded problem: embedded_s 0.2 x max(1, 4 / 4 cores) = 0.2
    p = make_params(startup_by_ranks={2: 1.0, 6: 3.0})
    got = pm.predict_init(p, Run(workers=3))
    assert got["startup_s"] == approx(2.0) and got["init_s"] == approx(2.2)
    # another core count than the calibrated one: the per-rank stages again
    other = pm.predict_init(p, Run(workers=3, cores=8))
    assert other["startup_s"] == approx(pm.predict_startup(p.startup, 4, p.parallelism(4, 8)))


def test_cores_worth_per_hidden_size():
    # measured at hidden 10000 (9 ranks: 1.8) and 100000 (1.5): 31623 is midway in log(hidden)
    p = make_params(cores=2, effective_cores={10000: {1: 1.0, 2: 1.9, 9: 1.8}, 100000: {1: 1.0, 2: 1.7, 9: 1.5}})
    assert p.cores_worth(9, 10000) == approx(1.8) and p.cores_worth(9, 100000) == approx(1.5)
    assert p.cores_worth(9, 31622.776601683792) == approx(1.65)
    assert p.cores_worth(9, 1000) == approx(1.8)       # below the measured sizes: the nearest
    assert p.cores_worth(17, 100000) == approx(1.5)    # beyond the measured ranks: flat
    assert p.parallelism(2, hidden=100000) == approx(1.7)


def test_a_clusters_nodes_each_bring_their_own_cores():
    """20 ranks on 4 nodes of 16 cores (5 a node) are not crowded: an asynchronous run
    trains as fast as on one node of 64 cores, not as 20 ranks on 16 (optimize's
    --nodes; each node's cores its own)."""
    p = make_params()
    run = Run(**{**TRAIN, "workers": 16, "servers": 4, "points": 16 * 64 * 10})
    cluster = pm.predict_train(p, dataclasses.replace(run, cores=16, node_ranks=5))
    big = pm.predict_train(p, dataclasses.replace(run, cores=64))
    crowded = pm.predict_train(p, dataclasses.replace(run, cores=16))
    assert cluster["updates_per_s"] == approx(big["updates_per_s"]) and cluster["bound"] != "cores"
    assert crowded["updates_per_s"] < cluster["updates_per_s"] and crowded["bound"] == "cores"   # one node: they crowd


def test_evaluation_at_the_runs_cadence_where_rank_0_holds_w_and_never_with_shards():
    # 100 held-out points x 1e-6 s (hidden 100): --eval-every epoch, after each of 3 epochs
    # with one server; none during training with two (rank 0 assembles w only for the
    # final metrics, after train_s)
    epoch = {**TRAIN, "epochs": 3, "eval_every": "epoch"}
    one = pm.predict_train(make_params(), Run(**epoch))
    two = pm.predict_train(make_params(), Run(**{**epoch, "servers": 2}))
    assert one["evaluate_s"] == approx(3e-4) and two["evaluate_s"] == 0.0
    # model partitioning: one server holds both slices, so rank 0 evaluates as with one
    # (asgd.run.roles.tracker_of); p2p's and allreduce's rank 0 holds a slice: never
    mp = {**epoch, "workers": 2, "model_parallel": 2}
    assert pm.evaluates(Run(**mp)) and pm.evaluates(Run(**{**mp, "model_parallel": 1, "arch": "p2p"}))
    assert not pm.evaluates(Run(**{**mp, "arch": "p2p"})) and not pm.evaluates(Run(**{**mp, "arch": "allreduce"}))


def test_a_p2p_rank_0_evaluates_at_most_once_an_exchange_of_its_own():
    """At --eval-every 1 a ps server evaluates every version; p2p's rank 0 only after its
    worker's own exchanges (core.target.AfterExchange): 3 peers of 5 steps make 15
    versions and 5 evaluations of 100 points x 1e-6 s."""
    run = {**TRAIN, "eval_every": "1"}
    ps = pm.predict_train(make_params(), Run(**run))["evaluate_s"]
    p2p = pm.predict_train(make_params(), Run(**{**run, "arch": "p2p"}))["evaluate_s"]
    assert ps == approx(15 * 1e-4) and p2p == approx(5 * 1e-4)


def test_deferred_evaluations_are_priced_as_copies_of_w_at_the_same_cadence():
    """--eval-deferred: the same 15 versions at --eval-every 1, each a copy of w (n_w
    values at memory_s_per_byte a byte), not 100 held-out points at 1e-6 s (the simulator's
    Costs.evaluate is analytic.evaluation_cost_s too)."""
    run = Run(**{**TRAIN, "eval_every": "1", "eval_deferred": True})
    p = make_params()
    copy = run.n_w * run.value_bytes * p.memory_s_per_byte
    assert pm.evaluation_cost_s(p, run) == approx(copy) and copy < 1e-4
    assert pm.predict_train(p, run)["evaluate_s"] == approx(15 * copy)


def test_a_lockstep_run_is_evaluated_per_round_not_per_workers_push():
    """A sync round is one version of w on the server's tracker (bench_tta's MNIST ps sync
    4x256 at --eval-every 1: 36 evaluations over 9 epochs of 4 rounds), so 4 workers' rounds
    at every version make 4 evaluations an epoch, not 16."""
    run = Run(workers=4, mode="sync", hidden=100, batch=64, points=1024, test_points=100, epochs=1, eval_every="1")
    assert arch.lockstep(make_params(), run)["evaluate_s"] == approx(4 * 100 * 1e-6)


def test_auto_evaluation_stays_within_its_budget_where_one_an_epoch_would_not():
    """--eval-every auto (the default): a fast run (float32's 2-10K-2 here: an evaluation
    ~14 % of an epoch) gets only what EVAL_BUDGET of its training pays for, after the
    estimate's wait; the model charged one an epoch (train +14 %, its median APE 15.5 %)."""
    p = make_params(eval_s_per_point={100: 1e-4, 400: 4e-4})   # an evaluation: 0.01 s
    run = Run(**{**TRAIN, "epochs": 8})
    steps_s = pm.predict_train(p, dataclasses.replace(run, test_points=0))["train_s"]
    assert 0.01 > 0.05 * steps_s / 8   # one an epoch would cost more than its budget
    auto = pm.predict_train(p, run)["evaluate_s"]
    assert auto <= EVAL_BUDGET * (steps_s + auto) and auto < 8 * 0.01
    assert pm.predict_train(p, dataclasses.replace(run, eval_every="epoch"))["evaluate_s"] == approx(8 * 0.01)
    assert pm.predict_train(p, dataclasses.replace(run, epochs=400))["evaluate_s"] > 0   # a long run: some


# -- every architecture in Alqahtani & Demirbas's form (asgd.perf.architectures) ----------

LOCK = dict(hidden=400, batch=64, points=960, test_points=0, epochs=1, mode="sync", node_ranks=1)


def test_iteration_link_terms_are_the_papers_bytes_over_bandwidth():
    """With nothing measured but the step, T_comm is the busiest link's bytes over B: ps
    2 W M / (S B) (every worker pushes a shard to each server), p2p 2 (N - 1) M / (N B), the ring
    2 (P - 1) M / (P B) plus its 2 (P - 1) latencies (M: the message, asgd's header included)."""
    B, L = 1e7, 1e-4
    p = arch.cluster_links(make_params(cores=64), B, L)
    W, n = 8, Run(workers=1, **LOCK).n_w
    def wire(k):
        return DOUBLE * (math.ceil(k) + PUSH_HEADER) / B
    ps = arch.iteration(p, Run(workers=W, servers=2, arch="ps", **LOCK))
    assert ps.link_s == pytest.approx(2 * W * wire(n / 2)) and ps.latency_s == pytest.approx(2 * L)
    p2p = arch.iteration(p, Run(workers=W, arch="p2p", **LOCK))
    assert p2p.link_s == pytest.approx(2 * (W - 1) * wire(n / W))
    ring = arch.iteration(p, Run(workers=W, arch="allreduce", **LOCK))
    assert ring.link_s == pytest.approx(2 * (W - 1) * wire((n + 3) / W))
    assert ring.latency_s == pytest.approx(2 * (W - 1) * L)
    # one server's link carries every worker's whole w: the worst where links bind; p2p and
    # the ring move the same bytes, the ring in 2 (P - 1) steps of latency
    one = arch.iteration(p, Run(workers=W, servers=1, arch="ps", **LOCK))
    assert one.link_s == pytest.approx(2 * W * wire(n)) and one.bound == "server link"
    assert one.comm_s > ps.comm_s > ring.comm_s > p2p.comm_s
    assert ps.compute_s == one.compute_s == p.step(400, 64)   # one core each: no stretch


def test_each_optimizer_pays_its_measured_update():
    """A server's adagrad update costs what calibrate measured beyond sgd's add (which
    c_u holds already); allreduce ranks pay the whole update; nothing measured: sgd's."""
    n = Run(workers=1, **LOCK).n_w
    opt = {"sgd": {100: 1e-6, 10_000: 1e-5}, "adagrad": {100: 5e-6, 10_000: 5e-5}}
    p = make_params(cores=64, optimizer_s=opt)
    base = dict(workers=32, **{**LOCK, "mode": "async"})   # the server binds
    sgd = pm.predict_train(p, Run(optimizer="sgd", **base))
    ada = pm.predict_train(p, Run(optimizer="adagrad", **base))
    assert ada["c_u_s"] - sgd["c_u_s"] == pytest.approx(p.per_nw(opt["adagrad"], n) - p.per_nw(opt["sgd"], n))
    assert ada["train_s"] > sgd["train_s"]
    bare = make_params(cores=64)
    assert (pm.predict_train(bare, Run(optimizer="adagrad", **base))
            == pm.predict_train(bare, Run(optimizer="sgd", **base)))
    ring = arch.iteration(p, Run(workers=2, arch="allreduce", optimizer="adagrad", **LOCK))
    assert ring.optimizer_s == pytest.approx(p.per_nw(opt["adagrad"], n))


def test_model_partitioning_steps_a_slice_and_sums_the_logits():
    p = make_params(cores=64, mp_step_s={2: {100: {64: 1e-4}, 400: {64: 3e-4}}},
                    exchange_s={"replica": {2: {16: 1e-5, 1024: 3e-5}, 4: {16: 2e-5, 1024: 6e-5}}})
    it = arch.iteration(p, Run(workers=4, servers=2, arch="ps", model_parallel=2, **LOCK))
    assert it.compute_s == pytest.approx(3e-4)                         # the member's step, measured
    assert it.replica_s == pytest.approx(1e-5 + (64 - 16) * 2e-5 / 1008)
    with pytest.raises(ValueError, match="must divide the workers"):
        predict(p, Run(workers=3, arch="ps", model_parallel=2, **LOCK))
    with pytest.raises(ValueError, match="unknown architecture"):
        predict(p, Run(workers=2, arch="mesh", **LOCK))


def test_measured_exchanges_are_interpolated_in_size_and_extrapolated_in_ranks():
    p = make_params(exchange_s={"mpi": {2: {100: 1e-4, 1100: 2e-4}, 4: {100: 3e-4, 1100: 4e-4}}})
    assert p.exchange("mpi", 2, 600) == pytest.approx(1.5e-4)
    assert p.exchange("mpi", 6, 100) == pytest.approx(5e-4)          # along the last two rank counts
    assert p.exchange("ring", 4, 100) == 0.0                          # not measured: nothing


def _crowded_params(lost: float) -> Params:
    """4 cores; the ring's no-compute round at 2 and 9 ranks, and its round after a step
    (ring+step) at 9 ranks `lost` seconds longer than the model's own round of that probe."""
    H, B = arch.STEP_PROBE
    n = 5 * H + 2
    p = make_params(exchange_s={"ring": {2: {n: 1e-3}, 9: {n: 3e-3}}})
    probe = Run(workers=9, arch="allreduce", hidden=H, batch=B, points=9 * B, mode="sync")
    modelled = arch.iteration(p, probe, turns=False).iteration_s
    return dataclasses.replace(p, exchange_s={**p.exchange_s, "ring+step": {9: {n: modelled + lost}}})


def test_crowding_is_what_the_stepped_probe_lost_beyond_the_model():
    p = _crowded_params(0.02)
    assert arch.crowding(p, "ring", 9) == pytest.approx(0.02)
    assert arch.crowding(p, "ring", 4) == 0.0 and arch.crowding(p, "ring", 2) == 0.0   # a core each
    assert arch.crowding(p, "ring", 6.5) == pytest.approx(0.01)       # linear from the cores' count
    assert arch.crowding(p, "ring", 17) == pytest.approx(0.02)        # none beyond the largest probe
    assert arch.crowding(p, "mpi", 9) == 0.0                          # not measured: nothing
    assert arch.crowding(p, "ring", 18, cores=8) == pytest.approx(0.02)   # as crowded as 9 on 4 cores
    assert arch.crowding(_crowded_params(-0.01), "ring", 9) == 0.0    # a probe faster than the model: nothing
    probe_step = p.step(*arch.STEP_PROBE)
    assert arch.crowding(p, "ring", 9, step_s=probe_step / 4) == pytest.approx(0.005)   # a shorter step: less
    assert arch.crowding(p, "ring", 9, step_s=probe_step * 4) == pytest.approx(0.02)    # a longer one: no more
    H, B = arch.STEP_PROBE
    probe = Run(workers=9, arch="allreduce", hidden=H, batch=B, points=9 * B, mode="sync")
    assert arch.iteration(p, probe).iteration_s == pytest.approx(p.exchange_s["ring+step"][9][5 * H + 2])


def test_a_crowded_lockstep_iteration_pays_the_crowding_and_one_with_a_core_each_does_not():
    p = _crowded_params(0.02)
    crowded = Run(workers=9, arch="allreduce", **{**LOCK, "node_ranks": 0})
    lost = 0.02 * p.step(LOCK["hidden"], LOCK["batch"]) / p.step(*arch.STEP_PROBE)   # its step is the shorter
    it = arch.iteration(p, crowded)
    assert 0 < it.crowd_s == pytest.approx(lost)
    assert it.iteration_s - arch.iteration(p, crowded, turns=False).iteration_s == pytest.approx(lost)
    assert arch.lockstep(p, crowded)["terms"]["crowd_s"] == pytest.approx(lost)
    assert arch.iteration(p, dataclasses.replace(crowded, cores=16)).crowd_s == 0.0


def test_a_crowded_async_worker_pays_its_measured_turns():
    """async+step: an asynchronous ps worker's seconds per update with a step before each;
    the model then predicts that probe's own rate, and a crowded run's rate falls with it."""
    H, B = arch.STEP_PROBE
    p = make_params()
    probe = Run(workers=8, servers=1, hidden=H, batch=B, points=8 * B * 20)
    period = 8 / pm.predict_train(p, probe)["updates_per_s"]
    q = dataclasses.replace(p, exchange_s={"async+step": {9: {5 * H + 2: period + 0.05}}})
    assert arch.crowding(q, "async", 9) == pytest.approx(0.05)
    assert 8 / pm.predict_train(q, probe, arch.crowding)["updates_per_s"] == pytest.approx(period + 0.05)
    assert pm.predict_train(q, probe) == pm.predict_train(p, probe)   # no crowding passed: no turns
    run = Run(workers=6, hidden=400, batch=64, points=6 * 64 * 10)   # 7 ranks on 4 cores
    assert pm.predict_train(q, run, arch.crowding)["updates_per_s"] < pm.predict_train(p, run)["updates_per_s"]
    assert predict(q, run).detail["updates_per_s"] == pm.predict_train(q, run, arch.crowding)["updates_per_s"]


def test_a_crowded_replica_pays_the_turns_its_probe_measured():
    """replica+step at an odd rank count: replicas of 2 with the logit sum inside each
    member's step, pushing asynchronously to a server on rank 0, as asgd.train runs model
    partitioning; the model then predicts that probe's own round, and that probe is a
    model-partitioned run's only crowding (its server's turns are in it)."""
    H, B = arch.STEP_PROBE
    p = make_params()
    probe = Run(workers=8, servers=1, hidden=H, batch=B, points=8 * B * 20, model_parallel=2)
    period = 8 / pm.predict_train(p, probe)["updates_per_s"]
    q = dataclasses.replace(p, exchange_s={"replica+step": {9: {B: period + 0.05}},
                                           "async+step": {9: {5 * H + 2: 1.0}}})
    assert arch.crowding(q, "replica", 9) == pytest.approx(0.05)
    assert 8 / pm.predict_train(q, probe, arch.crowding)["updates_per_s"] == pytest.approx(period + 0.05)
    whole = Run(workers=8, servers=1, hidden=H, batch=B, points=8 * B * 20)
    assert 8 / pm.predict_train(q, whole, arch.crowding)["updates_per_s"] > 0.5   # a whole-model worker pays async's


# [hidden][batch][D + C] a step of a D-H-C MLP; 4 is 2-H-2 (STEP_S's own values)
SHAPE_S = {h: {b: {4: t, 5: 2 * t, 74: 20 * t, 794: 200 * t} for b, t in STEP_S[h].items() if b in (16, 1024)}
           for h in STEP_S}
SHAPE_S[400][1024] = {4: STEP_S[400][1024], 5: 3 * STEP_S[400][1024], 74: 30 * STEP_S[400][1024],
                      794: 300 * STEP_S[400][1024]}


def test_a_data_files_features_and_classes_price_its_steps():
    """calibrate's step tables are 2-H-2's: a 784-H-10 run (MNIST's shape) is priced at
    the measured generic step over the fused 2-H-2 one's, in every table the model and the
    simulator read (its evaluation too); log-log between measured D + C, in proportion
    beyond; the nearest measured hidden and batch beyond theirs. The crowding probes,
    which stepped 2-10K-2, keep 2-H-2's."""
    p = make_params(shape_s=SHAPE_S)
    m = p.shaped(784, 10)
    assert m.step(100, 16) == approx(200 * p.step(100, 16)) and m.step(400, 1024) == approx(300 * p.step(400, 1024))
    assert m.step(100, 64) == approx(200 * p.step(100, 64))             # ratios alike at batch 16 and 1024
    assert m.eval_s_per_point[100] == approx(200 * p.eval_s_per_point[100])
    assert p.shape_factor(1578, 10, 100, 16) == approx(400)             # beyond 794: in proportion to D + C
    between = p.shape_factor(30, 10, 100, 16)                          # log-log between 5 and 74
    assert between == approx(2 * 10 ** (math.log(40 / 5) / math.log(74 / 5)))
    assert p.shape_factor(784, 10, 50, 16) == approx(200) and p.shape_factor(784, 10, 4000, 2048) == approx(300)
    assert m.paper_shape() == p and p.shaped(2, 2) is p
    run = Run(workers=1, hidden=100, batch=16, points=4096)
    wide = dataclasses.replace(run, features=784, classes=10)
    assert predict(p, wide).compute_s == approx(200 * predict(p, run).compute_s)
    assert predict(p, wide).comm_s > predict(p, run).comm_s               # and its messages are n_w's
    with pytest.warns(pm.ShapeFallback, match="784-H-10 run's steps are priced as 2-H-2's.*calibrate again"):
        assert make_params().shaped(784, 10).step(100, 16) == approx(p.step(100, 16))


def measured_at(features: int, classes: int, hidden: int, s_per_point: float, precision: str = "float64") -> dict:
    """params.json's statistics.evaluation as the pilot writes it (asgd.probes.pilot.measured_evaluation)."""
    return {"s_per_point": s_per_point, "evaluations": 50, "features": features, "classes": classes,
            "hidden": hidden, "precision": precision}


def test_an_evaluation_at_the_pilots_shape_is_priced_at_its_measured_figure():
    """Where the pilot measured the held-out evaluation on the data (784-H-10 at hidden 100),
    the model prices it at that figure, not 2-H-2's scaled by the step's shape factor (200
    here, 2e-4 s a point); at other hidden sizes, the estimate's ratio between them. Its
    steps keep the shape factor. Another shape, or the other precision, keeps the estimate."""
    p = make_params(shape_s=SHAPE_S, evaluation=measured_at(784, 10, 100, 5e-5))
    m = p.shaped(784, 10)
    assert m.eval_s_per_point[100] == approx(5e-5)                     # measured, not 200 x 1e-6
    assert m.eval_s_per_point[400] == approx(5e-5 * (300 * 4e-6) / (200 * 1e-6))   # the estimate's ratio
    assert m.step(100, 16) == approx(200 * p.step(100, 16))
    assert p.shaped(64, 10).eval_s_per_point == make_params(shape_s=SHAPE_S).shaped(64, 10).eval_s_per_point
    other = make_params(shape_s=SHAPE_S, evaluation=measured_at(784, 10, 100, 5e-5, "float32"))
    assert other.shaped(784, 10).eval_s_per_point[100] == approx(200 * 1e-6)
    run = Run(workers=1, hidden=100, batch=16, points=4096, test_points=1000, epochs=3, eval_every="epoch",
              features=784, classes=10)
    assert predict(p, run).detail["evaluate_s"] == approx(3 * 1000 * 5e-5)
    assert predict(make_params(shape_s=SHAPE_S), run).detail["evaluate_s"] == approx(3 * 1000 * 200 * 1e-6)
    with pytest.warns(pm.ShapeFallback):   # calibrated before shape_s: the steps 2-H-2's, the evaluation measured
        assert make_params(evaluation=measured_at(784, 10, 100, 5e-5)).shaped(784, 10).eval_s_per_point[100] \
            == approx(5e-5)


def test_params_from_a_whole_file_carry_the_pilots_measured_evaluation():
    params = json.loads(json.dumps(dataclasses.asdict(make_params(shape_s=SHAPE_S))))
    measured = measured_at(784, 10, 100, 5e-5)
    assert Params.from_file({"params": params, "statistics": {"b_noise": 1.0, "evaluation": measured}}).evaluation \
        == measured
    assert Params.from_file({"params": params}).evaluation == {}             # no pilot
    assert Params.from_file({"params": params, "statistics": {"b_noise": 1.0}}).evaluation == {}   # an older one


def test_a_shaped_params_keeps_its_shape_in_every_precision():
    two = two_precisions(2.0)
    two["precisions"]["float64"]["shape_s"] = SHAPE_S
    two["precisions"]["float32"]["shape_s"] = SHAPE_S
    m = Params.from_dict(json.loads(json.dumps(two))).shaped(784, 10)
    f32 = m.at("float32")
    assert f32.shape == (784, 10) and f32.step(100, 16) == approx(m.step(100, 16) / 2)
