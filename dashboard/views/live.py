"""Live trajectories: each trajectory of a step with its turns side by side, refreshed as events arrive.

A turn shows the prompt (decoded from the stored token ids when the run's tokenizer is on this host), the
kernel with syntax highlighting, its diff against the previous turn, the verdict's category, feedback and
timings, and the reward and advantage the update uses (provisional until the step's update is recorded).
"""

from __future__ import annotations

import streamlit as st
from dashlib import ago, badge, diff, kernel_source, opt, projection, prompt_text, refresh_s, select_run

from kbrl.metrics.projections import RunProjection
from kbrl.training.replay import Sample

st.title("Live trajectories")
run_id = select_run("train")


def turn_view(proj: RunProjection, sample: Sample, previous: Sample | None, reward: float | None,
              advantage: float | None) -> None:  # fmt: skip
    """One turn: header numbers, then the prompt, kernel, diff and feedback."""
    v = sample.verdict or {}
    info = proj.evals.get(sample.sample_id)
    category = v.get("category") if sample.verdict is not None else ("EVAL_FAILED" if sample.failed else None)
    st.markdown(f"**turn {sample.turn}** {badge(category)}")
    st.markdown(f"reward `{opt(reward)}` · advantage `{opt(advantage)}` · backend `{v.get('backend', '-')}`")
    stages = v.get("stage_seconds") or {}
    timing = f"eval {opt(info.seconds, 2)} s on {info.worker}" if info and info.seconds is not None else "eval: pending"
    if stages:
        timing += " · " + ", ".join(f"{k} {float(s):.2f}" for k, s in stages.items() if k != "total")
    st.caption(f"{timing} · sampled {ago(proj.sampled_at.get(sample.sample_id))} · policy v{sample.policy_version}")
    with st.expander("prompt"):
        text = prompt_text(proj, sample)
        if sample.prompt_ref is None:
            st.caption("(no prompt tokens stored for this sample)")
        elif text is None:
            st.caption(f"(the run's tokenizer is not on this host; prompt tokens: blob {sample.prompt_ref})")
        else:
            st.text(text)
    st.code(kernel_source(sample.text), language="python")
    if previous is not None:
        with st.expander("diff against the previous turn"):
            st.code(diff(kernel_source(previous.text), kernel_source(sample.text)), language="diff")
    if sample.failed:
        st.error(f"evaluator failed: {sample.failed}")
    elif v.get("feedback"):
        with st.expander("feedback"):
            st.text(str(v["feedback"]))


@st.fragment(run_every=refresh_s())
def live_view(run_id: str) -> None:
    proj = projection(run_id)
    steps = proj.steps()
    st.caption(f"last event position: {proj.last_position} · refreshes every {refresh_s():g} s")
    if not steps:
        st.info("No samples yet: this page fills in as the run writes them.")
        return
    follow = st.toggle("Follow the latest step", value=True, key="follow-latest")
    number = steps[-1] if follow else st.selectbox("Step", steps, index=len(steps) - 1, key="live-step")
    step = proj.state.steps[number]
    scores = proj.scores(number)
    judged = sum(s.verdict is not None for s in step.samples.values())
    state = "update recorded" if step.done else "in progress (rewards and advantages provisional)"
    st.subheader(f"Step {number}: {judged}/{len(step.samples)} judged, {state}")
    trajectories = proj.trajectories(number)
    limit = st.number_input("Trajectories shown", min_value=1, value=min(32, len(trajectories)), key="live-limit")
    for traj, samples in list(trajectories.items())[: int(limit)]:
        with st.container(border=True):
            first = samples[0]
            st.markdown(f"**{traj}** · `{first.problem_id}` · group {first.group} · {len(samples)} turn(s)")
            for i, (col, sample) in enumerate(zip(st.columns(len(samples)), samples, strict=True)):
                with col:
                    turn_view(proj, sample, samples[i - 1] if i else None, scores.rewards.get(sample.sample_id),
                              scores.advantages.get(sample.sample_id))  # fmt: skip


if run_id is not None:
    live_view(run_id)
