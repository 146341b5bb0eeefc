"""Mutation check: does the test suite catch deliberately broken code? Each mutation below is one
exact string replacement in one file, with the smallest test that should fail because of it. The
script checks the current tree out into a temporary git worktree (plus the uncommitted changes),
runs every named test once unmutated (they must pass, or a failure would prove nothing), applies
each mutation in turn, runs its test with `python -m pytest -x -q`, restores the file, and prints a table: mutation | file | catching test | caught. Exit 1 if any mutation survives
(its test passed) or could not be tried; 0 if every one was caught.

    python lab/mutations.py                 # all of them, a few minutes of CPU
    python lab/mutations.py --only rope     # the mutations whose name contains 'rope'
    python lab/mutations.py --list          # the table of mutations, nothing run

The copy imports its own kcollect: a sitecustomize on PYTHONPATH maps `kcollect` to the copy's
collector/ (and kcollect.kernels to its kernels/) ahead of the editable install of this checkout,
also in the subprocesses the tests start. tests/test_lab.py checks that every search string occurs exactly once
in its file, so a refactor that moves the code makes that test fail rather than this script lie.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


class Mutation(NamedTuple):
    name: str
    file: str
    search: str
    replace: str
    test: str  # a pytest node id (file::test[param])


MUTATIONS = (
    # kernels
    Mutation("rms_norm mean divisor N -> N-1", "kernels/rms_norm/fwd.py",
             "rstd = tl.math.rsqrt(ss / N + eps)", "rstd = tl.math.rsqrt(ss / (N - 1) + eps)",
             "tests/test_rms_norm.py::test_every_element_is_written_and_rstd_saved"),
    Mutation("rms_norm eps dropped", "kernels/rms_norm/fwd.py",
             "rstd = tl.math.rsqrt(ss / N + eps)", "rstd = tl.math.rsqrt(ss / N)",
             "tests/test_rms_norm.py::test_forward_paths"),
    Mutation("rms_norm backward drops dx's mean term", "kernels/rms_norm/bwd.py",
             "dx = (m - xhat * c[:, None]) * rstd[:, None]", "dx = m * rstd[:, None]",
             "tests/test_rms_norm.py::test_every_element_is_written_and_rstd_saved"),
    Mutation("layer_norm backward drops dx's mean(w*dy) term", "kernels/layer_norm/bwd.py",
             "dx = (wdy * N - (xhat * s1[:, None] + s2[:, None])) * (rstd / N)[:, None]",
             "dx = (wdy * N - xhat * s1[:, None]) * (rstd / N)[:, None]",
             "tests/test_layer_norm.py::test_every_element_and_gradient"),
    Mutation("cross_entropy ignore_index rows not skipped", "kernels/cross_entropy/rows.py",
             "        if y == ignore_index:\n", "        if y == V:\n",
             "tests/test_cross_entropy.py::test_custom_ignore_index_strided_rows_and_int32_targets"),
    Mutation("rope sin and cos swapped", "kernels/rope/fwd.py",
             "    c1 = tl.load(cos_ptr + off, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)\n"
             "    c2 = tl.load(cos_ptr + off + HALF, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)\n"
             "    s1 = tl.load(sin_ptr + off, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)\n"
             "    s2 = tl.load(sin_ptr + off + HALF, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)\n",
             "    c1 = tl.load(sin_ptr + off, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)\n"
             "    c2 = tl.load(sin_ptr + off + HALF, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)\n"
             "    s1 = tl.load(cos_ptr + off, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)\n"
             "    s2 = tl.load(cos_ptr + off + HALF, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)\n",
             "tests/test_rope.py::test_layouts[hf-heads]"),
    # collector
    Mutation("correctness gate loosened 10x", "collector/verify.py",
             "return self.error <= self.tolerance", "return self.error <= 10 * self.tolerance",
             "tests/test_runner.py::test_the_gate_fails_an_error_just_over_the_tolerance"),
    Mutation("CPU times in seconds, not ms", "collector/timing.py",
             "out.append((clock() - t0) * 1e3)", "out.append(clock() - t0)",
             "tests/test_runner.py::test_cpu_timing_is_in_milliseconds"),
    Mutation("L2 flush skipped before timed calls", "collector/timing.py",
             "            flush.zero_()\n            starts[i].record()", "            starts[i].record()",
             "tests/test_runner.py::test_every_timed_cuda_call_follows_an_l2_flush"),
    Mutation("L2 flush shrunk from 256 MiB to 1 MiB", "collector/timing.py",
             "L2_FLUSH_BYTES = 256 * 1024 * 1024", "L2_FLUSH_BYTES = 1 * 1024 * 1024",
             "tests/test_runner.py::test_the_l2_flush_is_larger_than_the_l2_it_flushes"),
    Mutation("rope's bf16 tolerance raised 10x", "kernels/rope/spec.py",
             "tolerance={torch.bfloat16: 8e-3,", "tolerance={torch.bfloat16: 8e-2,",
             "tests/test_tolerances.py::test_an_error_of_a_few_roundings_fails_and_one_rounding_passes[rope-bf16]"),
    Mutation("dtype dropped from the series key", "collector/series.py",
             'row["shape"], row["dtype"], device(row)', 'row["shape"], None, device(row)',
             "tests/test_regress.py::test_every_field_of_a_row_keeps_its_series_apart"),
    Mutation("Jinja autoescape off", "collector/site.py",
             "autoescape=True,", "autoescape=False,",
             "tests/test_site_budgets.py::test_hostile_names_are_escaped_and_an_empty_store_says_so"),
    Mutation("--fail-on-incorrect ignored", "collector/run_cmd.py",
             "Output(fmt, verbose, fail_on_incorrect)", "Output(fmt, verbose, False)",
             "tests/test_collect.py::test_fail_on_incorrect_exits_1"),
    Mutation("a case's seed from its place in the plan", "collector/runner.py",
             "case_seed(self.config.seed, case)", "self.config.seed + self.seq",
             "tests/test_cli.py::test_a_failing_row_of_ours_exits_3_and_its_command_measures_it_again_alone"),
    Mutation("a store's blocks not checked when it is opened", "collector/store.py",
             "bad = damaged_blocks(self.path, block_size, blocks)", "bad = []",
             "tests/test_store.py::test_every_command_refuses_a_store_with_a_damaged_block"),
    Mutation("find names a commit for noise", "collector/find.py",
             "if p >= ALPHA or abs(", "if p > 1 or abs(",
             "tests/test_find.py::test_bisect_does_not_name_a_commit_for_noise"),
    Mutation("a point's own recheck does not widen it", "collector/verdicts.py",
             "np.maximum((prior + own) / (PRIOR_WEIGHT + n - 1), (prior + rss) / (PRIOR_WEIGHT + k))",
             "(prior + own) / (PRIOR_WEIGHT + n - 1)",
             "tests/test_compare.py::test_a_point_its_own_recheck_contradicts_is_less_certain"),
    Mutation("stability rule vouched for by the noisier measurement", "collector/stability.py",
             "tolerance(min(a.spread, b.spread), device)", "tolerance(max(a.spread, b.spread), device)",
             "tests/test_schedule.py::test_stability_rule"),
    Mutation("interpreter truncates bf16 again", "kernels/__init__.py",
             "\nround_to_nearest()", "\nround_to_nearest = None",
             "tests/test_interpreter.py::test_kernels_round_fp32_to_bf16_to_nearest_even_as_pytorch_does"),
    Mutation("a dead worker's breakdown dropped", "collector/collect.py",
             "combined(phases, slot.dead)", "combined(phases, [])",
             "tests/test_collect.py::test_a_measurement_that_crashes_or_hangs_its_process_is_an_error_row_and_the_run_goes_on"),
    Mutation("GPU workers dealt cases in plan order, not kept on their kernel", "collector/collect.py",
             "self.todo.pop(self._next_for(slot))", "self.todo.pop(0)",
             "tests/test_collect.py::test_gpu_workers_stay_on_their_kernel_and_share_only_the_last"),
    Mutation("precompile ignores what the caches hold (every run builds ahead again)", "collector/precompile.py",
             "        if k not in done and lost_key(cases[i], p, k) not in lost:\n", "        if True:\n",
             "tests/test_precompile.py::test_precompile_builds_each_unit_once_and_again_when_the_kernel_source_changes"),
    Mutation("precompile forgets the builds that hung or crashed an earlier pass", "collector/precompile.py",
             " and lost_key(cases[i], p, k) not in lost:\n", ":\n",
             "tests/test_collect.py::test_a_measurement_that_crashes_or_hangs_its_process_is_an_error_row_and_the_run_goes_on"),
    Mutation("precompile leaves the rest of a lost process's case to the measuring pass", "collector/precompile.py",
             "rest = todo[index][todo[index].index(building) + 1:] if building is not None else []",
             "rest = []",
             "tests/test_collect.py::test_a_measurement_that_crashes_or_hangs_its_process_is_an_error_row_and_the_run_goes_on"),
    Mutation("precompile gives the repeat of a crashed build to a fresh process to crash again", "collector/precompile.py",
             "for pair in followers(building, rest) if lost else ():", "for pair in ():",
             "tests/test_collect.py::test_a_build_that_repeats_a_crashed_one_is_not_begun"),
    Mutation("precompile keeps the tuning its processes made under load", "collector/precompile.py",
             "        forget_tuning(started)\n", "",
             "tests/test_precompile.py::test_precompile_builds_each_unit_once_and_again_when_the_kernel_source_changes"),
    Mutation("the RTU reference indexes its drive step by step (a backward quadratic in T)", "kernels/rtu/naive.py",
             "for t, d in enumerate(drive.unbind(1)):", "for t, d in ((t, drive[:, t]) for t in range(x.shape[1])):",
             "tests/test_references.py::test_a_references_backward_grows_linearly_with_the_steps[rtu]"),
    Mutation("precompile's time limit counts the process's start", "collector/precompile.py",
             'slot["ready"], slot["since"] = True, now', 'slot["ready"] = True',
             "tests/test_precompile.py::test_a_case_s_time_limit_counts_from_ready_on_the_pass_s_clock"),
    Mutation("the sLSTM backward loads two steps ahead instead of one", "kernels/slstm/sequence.py",
             "ahead = _saved(dy_ptr, raw_ptr, cs_ptr, ns_ptr, ms_ptr, rs_ptr, rows, row_ok, r64, h, u, m2, t - 1, T, NH,",
             "ahead = _saved(dy_ptr, raw_ptr, cs_ptr, ns_ptr, ms_ptr, rs_ptr, rows, row_ok, r64, h, u, m2, t - 2, T, NH,",
             "tests/test_slstm.py::test_resets_and_every_gradient"),
    Mutation("the sLSTM forward loads two steps ahead instead of one", "kernels/slstm/sequence.py",
             "ahead = _inputs(wx_ptr, rs_ptr, rows, row_ok, r64, h, u, m2, t + 1, T, NH, DH, has_resets)",
             "ahead = _inputs(wx_ptr, rs_ptr, rows, row_ok, r64, h, u, m2, t + 2, T, NH, DH, has_resets)",
             "tests/test_slstm.py::test_resets_and_every_gradient"),
    Mutation("the mLSTM forward's scan loads two chunks ahead instead of one", "kernels/mlstm/fwd.py",
             "ahead = _chunk_inputs(k_ptr, v_ptr, i_ptr, f_ptr, rs_ptr, bh, b, c + 1, T, DH, d, e, has_resets, L,",
             "ahead = _chunk_inputs(k_ptr, v_ptr, i_ptr, f_ptr, rs_ptr, bh, b, c + 2, T, DH, d, e, has_resets, L,",
             "tests/test_mlstm.py::test_value_blocks_and_resets[True]"),
    Mutation("lab.ab forces a variant's config around the forward only", "lab/ab.py",
             "call = force.wrap(verify.build_call(spec, force.wrap(fn), verify.clone_inputs(inputs), mode, dys))",
             "call = verify.build_call(spec, force.wrap(fn), verify.clone_inputs(inputs), mode, dys)",
             "tests/test_lab.py::test_a_config_the_backward_picks_is_forced_and_one_no_pick_takes_is_unavailable"),
    Mutation("lab.ab times a variant whose config no pick took", "lab/ab.py",
             "if config is not None and not force.taken:", "if False:",
             "tests/test_lab.py::test_a_config_the_backward_picks_is_forced_and_one_no_pick_takes_is_unavailable"),
    Mutation("attention's Gluon forward picked at D 64 past 2048 queries", "kernels/attention/config.py",
             "512 <= max_seqlen_q <= 2048", "512 <= max_seqlen_q <= 4096",
             "tests/test_attention_hopper.py::"
             "test_the_gluon_forward_is_picked_where_it_measured_faster_and_recorded_where_it_runs"),
    Mutation("attention's record says Gluon where the Triton kernel ran", "kernels/attention/spec.py",
             '"packed or a residual" if packed', 'None if packed',
             "tests/test_attention_hopper.py::"
             "test_the_gluon_forward_is_picked_where_it_measured_faster_and_recorded_where_it_runs"),
    Mutation("the gate decides slowdowns and speed-ups in one family", "collector/verdicts.py",
             "np.where(sign[family] == way, p[family] / 2, 1 - p[family] / 2)", "p[family]",
             "tests/test_compare.py::test_a_commits_speed_ups_do_not_lower_the_bar_for_its_slowdowns"),
    Mutation("attention's ping-pong forward picked from 2048 keys", "kernels/attention/config.py",
             "and keys >= 4096:", "and keys >= 2048:",
             "tests/test_attention_hopper.py::"
             "test_the_gluon_forward_is_picked_where_it_measured_faster_and_recorded_where_it_runs"),
    Mutation("a picked ping-pong falls back to the Triton kernel's 128-row tiles", "kernels/attention/config.py",
             "if picked and config.block_m == 128:", "if False:",
             "tests/test_attention_hopper.py::"
             "test_a_picked_pingpong_gives_way_to_the_64_row_forward_and_a_forced_one_keeps_its_tiles"),
    Mutation("attention's Gluon scope takes causal calls with fewer keys than queries", "kernels/attention/hopper.py",
             "if causal and keys < Sq:", "if False:",
             "tests/test_attention_hopper.py::test_scope[q_shape3-64-True-0-at least as many keys]"),
    Mutation("attention's Gluon scope takes calls without keys (a hang on the GPU)", "kernels/attention/hopper.py",
             "    if keys == 0:  # (its first key block", "    if False:  # (its first key block",
             "tests/test_attention_hopper.py::test_scope[q_shape8-0-False-0-at least one key]"),
    Mutation("the ping-pong's consumers get too few registers", "kernels/attention/pingpong.py",
             "CONSUMER_REGS = 240", "CONSUMER_REGS = 152",
             "tests/test_attention_hopper.py::"
             "test_the_tiles_compile_for_sm90_within_the_registers_and_shared_memory[False-pingpong]"),
    Mutation("attention's kept rounding of o in codes twice as coarse", "kernels/attention/fwd.py",
             "return 0 if mantissa is None else 23 - mantissa - 8",
             "return 0 if mantissa is None else 23 - mantissa - 7",
             "tests/test_attention_one_key.py::test_kept_rounding_gives_delta_of_o_in_fp32"),
    Mutation("softmax's forward takes its 8192-element segments past 262144 wide", "kernels/softmax/config.py",
             "wide = FWD_COOP_WIDE[0] <= N <= FWD_COOP_WIDE[1]", "wide = FWD_COOP_WIDE[0] <= N",
             "tests/test_softmax.py::test_pick_on_sm90"),
    Mutation("softmax's forward takes its 8192-element segments one element late", "kernels/softmax/config.py",
             "FWD_COOP_WIDE = (131073, 262144)", "FWD_COOP_WIDE = (131074, 262144)",
             "tests/test_softmax.py::test_pick_on_sm90"),
    Mutation("the LSTM backward's fp32 products summed in fp32", "kernels/lstm/sequence.py",
             "RESIDENT=config.resident_bwd, DOT_F32=dot_f32(dtype, device, FP64)",
             "RESIDENT=config.resident_bwd, DOT_F32=dot_f32(dtype, device)",
             "tests/test_lstm.py::test_fp32_recurrent_sums_rounded_once"),
    Mutation("the LSTM forward's fp32 products summed in fp32", "kernels/lstm/sequence.py",
             "DOT_F32=dot_f32(dtype, device, FP64), PRECISE=precise(dtype), PREFETCH=config.prefetch",
             "DOT_F32=dot_f32(dtype, device), PRECISE=precise(dtype), PREFETCH=config.prefetch",
             "tests/test_lstm.py::test_fp32_recurrent_sums_rounded_once"),
    Mutation("the LSTM backward loads two steps ahead instead of one", "kernels/lstm/sequence.py",
             "ahead = _bwd_inputs(dy_ptr, dhn_ptr, act_ptr, cs_ptr, rs_ptr, rows, row_ok, r64, u, n, m_u, m_n, t - 1,",
             "ahead = _bwd_inputs(dy_ptr, dhn_ptr, act_ptr, cs_ptr, rs_ptr, rows, row_ok, r64, u, n, m_u, m_n, t - 2,",
             "tests/test_lstm.py::test_inputs_loaded_a_step_ahead"),
    Mutation("a regression's way back follows its re-estimated levels, not its kind", "collector/regress.py",
             "sign = 1.0 if up else -1.0", "sign = 1.0 if after > before else -1.0",
             "tests/test_regress.py::test_a_regression_recovers_downwards_even_where_its_levels_came_out_below"),
    Mutation("the cells' rejudge takes an overflowing order's infinite error as its bar", "lab/awkward/cells.py",
             "if math.isfinite(e):  # an order that overflows sets no bar", "if True:  # an order that overflows sets no bar",
             "tests/test_awkward_cells.py::test_an_order_that_overflows_sets_no_bar"),
    Mutation("the state update's output off by 1e-6 relative (inside fp32's bound, 5x eager's error)",
             "kernels/selective_scan/step.py", "    y = y * z * tl.sigmoid(z)\n",
             "    y = y * z * tl.sigmoid(z) * 1.000001\n",
             "tests/test_steps.py::test_selective_state_update[1-16-16-dtype0-cpu]"),
    Mutation("a case whose inputs cannot be made ends the run", "collector/runner.py",
             "            except Exception as e:  # a plugin's inputs, or a shape it cannot take: this case's rows say so\n",
             "            except ZeroDivisionError as e:\n",
             "tests/test_runner.py::test_inputs_that_cannot_be_made_fail_their_case_not_the_run"),
    Mutation("--shape takes a fraction where the grids hold integers", "collector/shapes.py",
             "            if types == {int} or number is None:\n", "            if number is None:\n",
             "tests/test_find.py::test_restrict_refuses_labels_the_kernel_cannot_take[M=3,N=2.5-N must be an integer]"),
    Mutation("the site counts open steps of ours from partial runs among the peers'", "collector/site_pages.py",
             '            "open_other": sum(1 for r in others if not r.get("mine")),',
             '            "open_other": len(others),',
             "tests/test_site.py::test_open_steps_of_our_kernels_that_something_else_explains_are_not_counted_as_a_peers"),
    Mutation("a run forgets which boot of which host measured it", "collector/runner.py",
             '"host": host_identity(cfg.device)', '"host": {"boot_id": None, "gpu_uuid": None}',
             "tests/test_collect.py::test_two_workers_measure_the_plan_once_each_kernel_in_one_run"),
    Mutation("confirm's spawned measuring processes import the caller's kcollect", "collector/confirm_worker.py",
             'paths = [str(shim(root))]', 'paths = []',
             "tests/test_confirm.py::test_the_processes_a_run_starts_measure_the_worktree_s_code"),
    Mutation("confirm's worker measures the kernel's default grid", "collector/confirm_worker.py",
             'return [a for label in labels for a in ("--shape", label)]', 'return []',
             "tests/test_confirm.py::test_the_worker_measures_only_the_cases_it_is_given"),
    Mutation("the compare page loads every trend file of the GPU", "templates/site.js",
             "entries = entries.filter((e) => e.c.includes(ib) && (autoA || e.c.includes(ia)));", "",
             "tests/test_site_browser.py::test_compare_by_default_takes_as_a_the_last_commit_that_shares_a_series_with_b"),
    Mutation("site.js draws a trend file's band offsets as if they were times", "templates/site.js",
             "if (value && value.bands) unband(value);", "",
             "tests/test_site_browser.py::test_trend_bands_are_the_runs_p20_and_p80"),
    Mutation("the mLSTM backward's state gradients in 8 warps however many its programs", "kernels/mlstm/config.py",
             "state_warps_bwd=8 if by_chunk else 4", "state_warps_bwd=8",
             "tests/test_awkward_cells.py::test_mlstm_warps_on_the_gpu"),
    Mutation("the mLSTM backward's state gradients a program a chunk however many the rows", "kernels/mlstm/config.py",
             "by_chunk = rows * (dp // bv) < sms", "by_chunk = True",
             "tests/test_awkward_cells.py::test_mlstm_warps_on_the_gpu"),
    Mutation("the mLSTM chunk kernel leaves out the next chunk start's stabiliser gradient", "kernels/mlstm/bwd.py",
             "dim_next, dam_next = _next_start_grad(tl.load(dms_ptr + row + 1),",
             "dim_next, dam_next = _next_start_grad(0.0 * tl.load(dms_ptr + row + 1),",
             "tests/test_mlstm.py::test_state_gradients_by_chunk_and_by_row[a-program-a-chunk]"),
    Mutation("the mLSTM backward takes a sequence of two chunks as one (no next start's gradients)",
             "kernels/mlstm/bwd.py", "after = NC > 1", "after = NC > 2",
             "tests/test_mlstm.py::test_value_blocks_and_resets[True]"),
    Mutation("the mLSTM backward launches its chunk kernel with the forward's warps", "kernels/mlstm/bwd.py",
             "return config.state_warps_bwd or config.state_warps, config.warps_bwd or config.warps",
             "return config.state_warps_bwd or config.state_warps, config.warps",
             "tests/test_mlstm.py::test_the_backward_launches_with_its_own_warps"),
    Mutation("the mLSTM forward in 4 warps in fp32 too", "kernels/mlstm/config.py",
             "warps = warps_bwd if dtype in (torch.bfloat16, torch.float16) else 8", "warps = warps_bwd",
             "tests/test_awkward_cells.py::test_mlstm_warps_on_the_gpu"),
    Mutation("the selective scan's fp32 decays by exp2 of a rounded A log2(e)", "kernels/selective_scan/softplus.py",
             "        return exp_f32(dt * a, True)", "        return tl.exp2(dt * a2)",
             "tests/test_selective_scan.py::test_precise_decays_are_exp_of_the_step"),
    Mutation("the scans' parameter sums in fp32 for fp32 inputs", "kernels/_jit/scan.py",
             "    return tl.float64 if sum_dtype(dtype) == torch.float64 else tl.float32", "    return tl.float32",
             "tests/test_selective_scan.py::test_parameter_sums_are_fp64_for_fp32_inputs"),
    Mutation("the RTU backward's sums folded at 16 segments too", "kernels/rtu/lanes.py",
             "x1.dtype != torch.float32 and n_seg < FOLD_BELOW_SEGMENTS if", "x1.dtype != torch.float32 if",
             "tests/test_rtu.py::test_lanes_backward_folds_in_low_precision_below_16_segments"),
    Mutation("an edit of docstrings counts as a change of code", "collector/codechange.py",
             "node.body = node.body[1:] or [ast.copy_location(ast.Pass(), first)]", "pass",
             "tests/test_changed.py::test_an_edit_of_comments_or_docstrings_only_changes_nothing_that_runs"),
)


def check_applies(root: Path = ROOT) -> list[str]:
    """What keeps a mutation from applying: its search string not exactly once in its file."""
    problems = []
    for m in MUTATIONS:
        n = (root / m.file).read_text().count(m.search)
        if n != 1:
            problems.append(f"{m.name}: {m.file} holds the search string {n} times")
        if not (root / m.test.split("::")[0]).is_file():
            problems.append(f"{m.name}: no test file {m.test.split('::')[0]}")
    return problems


def check_tests_exist(root: Path = ROOT) -> list[str]:
    """The mutations whose catching test pytest does not collect (a renamed test, or a parametrized
    one whose ids changed): pytest would exit 4 on the node id, and the run would report an error
    instead of trying the mutation."""
    files = sorted({m.test.split("::")[0] for m in MUTATIONS})
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                         cwd=root, capture_output=True, text=True).stdout
    have = {line.strip() for line in out.splitlines()}
    return [f"{m.name}: pytest collects no {m.test}" for m in MUTATIONS
            if m.test not in have and not any(h.startswith(m.test + "[") for h in have)]


# Put first on sys.meta_path (sitecustomize runs at every start-up, subprocesses included): the
# packages as setuptools' package-dir maps them, from the copy.
_FINDER = """import sys
from importlib.util import spec_from_file_location

MAPPING = {mapping!r}


class MutantFinder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in MAPPING:
            return spec_from_file_location(fullname, MAPPING[fullname] + "/__init__.py",
                                           submodule_search_locations=[MAPPING[fullname]])
        return None


sys.meta_path.insert(0, MutantFinder)
"""


def _copy_of_the_tree(tmp: Path) -> Path:
    """A git worktree of HEAD with this checkout's uncommitted changes copied over, and a folder
    that makes `import kcollect` find the copy's packages."""
    tree = tmp / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), "HEAD"], check=True)
    changed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-m", "-o", "-d", "--exclude-standard"],
                             capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in filter(None, changed):
        src, dst = ROOT / rel, tree / rel
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        elif dst.exists():
            dst.unlink()
    path = tmp / "path"
    path.mkdir()
    (path / "sitecustomize.py").write_text(_FINDER.format(mapping={
        "kcollect": str(tree / "collector"), "kcollect.kernels": str(tree / "kernels"),
        "kcollect.templates": str(tree / "templates")}))
    return tree


def _run(tree: Path, env: dict, *tests: str) -> tuple[int, float, list[str]]:
    """pytest's exit code, seconds and last line for `tests` in the copy. Each run gets its own
    temporary folder: caches kept there (Jinja's compiled templates, keyed by the template's source
    only) would otherwise carry what the unmutated code compiled into the mutated run."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kcollect-mutant-tmp-") as tmp:
        p = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                           cwd=tree, env={**env, "TMPDIR": tmp}, capture_output=True, text=True)
    return p.returncode, time.perf_counter() - t0, (p.stdout + p.stderr).strip().splitlines()[-1:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="only the mutations whose name contains this")
    ap.add_argument("--list", action="store_true", help="print the mutations and their tests, run nothing")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.only in m.name]
    if not chosen:
        print(f"mutations: no mutation's name contains {args.only!r}", file=sys.stderr)
        return 2
    if args.list:
        for m in chosen:
            print(f"{m.name} | {m.file} | {m.test}")
        return 0
    problems = check_applies()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    rows, survived = [], 0
    with tempfile.TemporaryDirectory(prefix="kcollect-mutations-") as tmp:
        tree = _copy_of_the_tree(Path(tmp))
        try:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(tmp) / "path"),
                                                                               os.environ.get("PYTHONPATH")]))}
            where = subprocess.run([sys.executable, "-c", "import kcollect.kernels as k; print(k.__file__)"],
                                   cwd=tree, env=env, capture_output=True, text=True, check=True).stdout.strip()
            if not where.startswith(tmp):
                print(f"mutations: the copy imports kcollect.kernels from {where}, not the copy", file=sys.stderr)
                return 1
            tests = sorted({m.test for m in chosen})
            rc, seconds, last = _run(tree, env, *tests)
            print(f"unmutated: {' '.join(last)} ({seconds:.0f} s)", file=sys.stderr, flush=True)
            if rc != 0:
                print("mutations: the tests fail on the unmutated tree, so a failure would prove nothing",
                      file=sys.stderr)
                return 1
            for m in chosen:
                target = tree / m.file
                original = target.read_text()
                target.write_text(original.replace(m.search, m.replace, 1))
                try:
                    rc, seconds, last = _run(tree, env, m.test)
                finally:
                    target.write_text(original)
                caught = "yes" if rc == 1 else "no" if rc == 0 else f"error (pytest exit {rc})"
                survived += caught != "yes"
                rows.append((m.name, m.file, m.test, caught, f"{seconds:.0f} s"))
                print(f"{m.name}: {caught} ({seconds:.0f} s) {' '.join(last)}", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    head = ("mutation", "file", "catching test", "caught", "test time")
    print("| " + " | ".join(head) + " |\n| " + " | ".join("---" for _ in head) + " |")
    for r in rows:
        print("| " + " | ".join(f"`{c}`" if i in (1, 2) else c for i, c in enumerate(r)) + " |")
    print(f"\n{len(rows) - survived} of {len(rows)} caught")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
