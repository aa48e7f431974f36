"""``draftrl generate``: decode one prompt speculatively and report speed and exactness."""

from __future__ import annotations

import argparse
import json
import sys


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Target / drafter / device options shared by every command that decodes."""
    parser.add_argument("--target", default="smollm2-135m", help="target model: smollm2-135m, a local path or hub id")
    parser.add_argument(
        "--drafter", default="ngram", help="ngram[:MIN:MAX] | layerskip:N | none | draft model path (same vocab)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--sampler",
        default="correct",
        choices=["correct", "resample-from-p"],
        help="resample-from-p is the known-wrong correction, for negative controls of the exactness monitor",
    )
    parser.add_argument("--draft-sampling", action="store_true", help="model drafters sample proposals from q")
    parser.add_argument("--no-monitor", action="store_true", help="turn the exactness monitor off")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="decode a prompt with speculative decoding")
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    add_model_args(p)
    add_sampling_args(p)
    p.add_argument("--depth", type=int, default=4, help="draft depth per round (0 = plain decoding)")
    p.add_argument("--width", type=int, default=1, help="tree width: nodes kept per draft level (1 = chain)")
    p.add_argument("--verify-size", type=int, default=None, help="draft nodes the target verifies (default: all)")
    p.add_argument(
        "--policy", default=None, metavar="FILE",
        help="exported policy (draftrl export --format onnx) choosing depth and verify size every round; "
        "replaces --depth, --verify-size and --width",
    )
    p.add_argument("--ignore-eos", action="store_true",
                   help="decode to --max-new-tokens past EOS (vLLM's ignore_eos, HF's min_new_tokens): "
                        "benchmarks and negative controls run to length")
    p.add_argument("--truncate-prompt", action="store_true",
                   help="keep the prompt's last tokens when prompt + --max-new-tokens exceed the model's context "
                        "(default: refuse such a prompt)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("--chat needs a tokenizer with a chat template; drop --chat or use an instruct model")
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return list(ids)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def fit_prompt(prompt_ids: list[int], max_new_tokens: int, max_context: int | None, truncate: bool) -> list[int]:
    """``prompt_ids``, or with ``truncate`` its last ``max_context - max_new_tokens`` tokens (with a
    warning); a prompt that does not fit otherwise is refused (``check_fits``)."""
    from draftrl.decoding.engine import check_fits

    if truncate and max_context is not None and len(prompt_ids) + max_new_tokens > max_context:
        keep = max_context - max_new_tokens
        if keep < 1:
            raise ValueError(f"--max-new-tokens={max_new_tokens} leaves no room for a prompt in the target's context "
                             f"of {max_context} tokens; lower it.")
        print(f"draftrl generate: warning: prompt truncated from {len(prompt_ids)} to its last {keep} tokens "
              f"(--truncate-prompt; context {max_context}, max_new_tokens {max_new_tokens}).", file=sys.stderr)
        return prompt_ids[-keep:]
    check_fits(len(prompt_ids), max_new_tokens, max_context)
    return prompt_ids


def build_engine(args: argparse.Namespace):
    """(target LoadedModel, SpeculativeDecoder) from the shared CLI options."""
    from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
    from draftrl.decoding.factory import build_drafter, check_drafter_spec
    from draftrl.envs.engines import eos_token_ids
    from draftrl.models import check_model_spec, load_model

    config = EngineConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        sampler=args.sampler,
    )
    if hasattr(args, "depth"):  # refuse a bad action before spending seconds on loading models
        config.check_action(args.depth, args.verify_size, args.width)
    check_model_spec(args.target, "target")  # a typo fails now, not after loading the other model
    check_drafter_spec(args.drafter)
    target = load_model(args.target, dtype=args.dtype, device=args.device)
    drafter = build_drafter(args.drafter, target, sampled=args.draft_sampling, dtype=args.dtype, device=args.device)
    eos = [] if getattr(args, "ignore_eos", False) else eos_token_ids(target)
    return target, SpeculativeDecoder(target.model, drafter, config, eos_token_ids=eos)


def run(args: argparse.Namespace) -> int:
    from draftrl.decoding.generate import fixed_schedule, generate
    from draftrl.decoding.monitor import ExactnessMonitor, ExactnessViolation

    policy = policy_schedule(args) if args.policy else None  # before the models load: a bad file fails fast
    target, engine = build_engine(args)
    prompt_ids = fit_prompt(encode_prompt(target.tokenizer, args.prompt, args.chat), args.max_new_tokens,
                            engine.max_context, args.truncate_prompt)
    monitor = None if args.no_monitor else ExactnessMonitor()
    schedule = fixed_schedule(args.depth, args.verify_size, args.width)
    if policy is not None:
        policy.check_engine(engine)
        schedule = policy
    try:
        result = generate(engine, prompt_ids, schedule, monitor=monitor,
                          on_round=policy.observe if policy is not None else None)
    except ExactnessViolation as err:
        print(f"draftrl generate: EXACTNESS VIOLATION: {err}", file=sys.stderr)
        return 3
    text = target.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    summary = result.summary()
    if args.json:
        out = {"text": text, "token_ids": result.token_ids, **summary}
        out["settings"] = {k: v for k, v in vars(args).items() if k != "func"}
        out["exactness"] = monitor.report() if monitor is not None else None
        if policy is not None:
            out["policy_depth_histogram"] = dict(sorted(policy.depth_histogram.items()))
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(text)
        if monitor is not None:
            rep = monitor.report()
            print(f"\nexactness: {rep['verdict']} ({rep['verdict_reason']})", file=sys.stderr)
        print(
            f"\n[{summary['num_tokens']} tokens, {summary['tokens_per_second']:.1f} tok/s, "
            f"{summary['rounds']} rounds, {summary['mean_tokens_per_round']:.2f} tokens/round, "
            + (f"drafter={args.drafter} policy={args.policy} depths={dict(sorted(policy.depth_histogram.items()))}]"
               if policy is not None else
               f"drafter={args.drafter} depth={args.depth} width={args.width} verify_size={args.verify_size}]"),
            file=sys.stderr,
        )
    return 0


def policy_schedule(args: argparse.Namespace):
    """The ``--policy`` schedule: an exported policy and the training env's feature builder."""
    from draftrl.export.controller import PolicyController
    from draftrl.export.schedule import PolicySchedule

    schedule = PolicySchedule(PolicyController(args.policy))
    trained_with = (schedule.controller.manifest.get("features") or {}).get("drafter")
    if trained_with and trained_with != args.drafter:
        print(f"draftrl generate: warning: the policy was trained with drafter {trained_with!r}, decoding uses "
              f"{args.drafter!r}; its draft features mean something else (pass --drafter {trained_with}).",
              file=sys.stderr)
    return schedule
