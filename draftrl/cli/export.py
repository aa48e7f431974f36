"""``draftrl export``: a trained policy for serving: its network, or an engine config derived from it.

Example::

    draftrl export runs/replay/policy.zip --format onnx --out policy.onnx          # + policy.onnx.json
    draftrl export runs/replay --format torchscript --out policy.pt                # + policy.pt.json
    draftrl export runs/replay/policy.zip --format vllm --out vllm.json             # static config
    draftrl export runs/replay --format vllm --out runs/vllm_policy                 # policy inside vLLM
    draftrl export runs/head_policy --format vllm --out runs/vllm_head              # stock eagle3, K per batch size
    draftrl export stop:6:t0.6@sam:2 --format vllm --out runs/vllm_sam             # the head inside vLLM
    draftrl export vllm-eagle3:1-1:3,2-16:1 --format vllm --out runs/vllm_eagle3   # stock vLLM, K per batch size
    draftrl export runs/replay/policy.zip --format sglang --out sglang.json        # + sglang.json.adaptive.json

onnx / torchscript write the policy network alone plus a manifest (feature order, normalisation,
grids, training config, versions) and check the export against SB3 before writing the manifest.
vllm / sglang with OUT.json write static speculation settings derived from the policy's depth
distribution and the cost model (see draftrl/export/engine_config.py and docs/export.md); vllm
with a directory writes the policy, its manifest and the custom_class proposer settings that run
it inside vLLM 0.32 (draftrl/export/vllm_bundle.py): per-request n-gram policies (TraceReplay-v1,
SpecDecode-v2) and serving policies (ServeReplay-v1, ServeVLLM-v1: one depth cap and budget per
engine step, the env's observation rebuilt inside vLLM); per-request policies trained with an
EAGLE-3 head or a draft model go to stock vLLM (eagle3 / draft_model with a K per batch size, the
drafter copied into the bundle). Paths in a bundle are relative to it; it names the run's target.
A refused policy writes nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from draftrl.cli import _options
from draftrl.cli._options import add_out


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from draftrl.export import FORMATS

    parser = subparsers.add_parser(
        "export",
        help="export a trained policy: network to ONNX/TorchScript, or a vLLM/SGLang config",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("policy", help="run directory of draftrl train, its policy.zip, or a checkpoint zip; "
                                       "with --format vllm also a head rule (fixed:K[:V][:bB], stop:K:tT[:bB], "
                                       "stop:K:cT[:bB], drafting with an eagle3 or sam drafter: --drafter or @DRAFTER) "
                                       "or a stock one (vllm-eagle3:K, vllm-eagle3:S-E:K,..., vllm-ngram:K, "
                                       "vllm-ngram:S-E:K,...)")
    parser.add_argument("--drafter", default=None,
                        help="vllm rules: the drafter spec a head rule drafts with, eagle3[:DIR] or sam:N[:DIR], "
                             "and whose "
                             "head vllm-eagle3 loads (DIR a folder or hub id; default: the head draftrl ships)")
    _options.add_retired(parser, "--head", "the head is part of the drafter spec: --drafter eagle3:{value} (or the "
                         "rule's @eagle3:{value})")
    parser.add_argument("--target", default=None,
                        help="vllm rules: the target the bundle names (default smollm2-135m); a run's bundle names the "
                             "run's own target (another one is refused)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="vllm (directory): the GPU share the bundle's LLM(...) / vllm serve lines give vLLM "
                             "(default: vLLM's 0.9)")
    parser.add_argument("--tensor-parallel-size", type=int, default=None,
                        help="vllm (directory): GPUs the bundle's lines split the target over (vLLM's "
                             "tensor_parallel_size; default 1)")
    parser.add_argument("--cost-table", default=None,
                        help="vllm/sglang static tables and the stock route of head / draft-model policies: step costs "
                             "measured by draftrl calibrate --json --out FILE (default: the run's own; a run without "
                             "measured costs is refused)")
    parser.add_argument("--format", required=True, choices=FORMATS)
    add_out(parser, "file to write (the manifest goes to OUT.json); --format vllm: a bundle folder unless OUT.json",
            overwrite="replace an earlier export at --out (a bundle folder's earlier files are removed first)")
    parser.add_argument("--check-observations", type=int, default=4096,
                        help="onnx/torchscript: observations the export is checked on against SB3 (0 = skip)")
    parser.add_argument("--saturation-tokens", type=float, default=256,
                        help="vllm/sglang: tokens per target forward at which the serving GPU turns compute-bound")
    parser.add_argument("--max-batch-size", type=int, default=512, help="vllm/sglang: largest batch size tabulated")
    parser.add_argument("--min-share", type=float, default=0.05,
                        help="sglang: depths the policy uses in at least this share of rounds become candidate steps")
    parser.add_argument("--episodes", type=int, default=20,
                        help="vllm/sglang: rollout episodes when the run has no evaluation to read the depths from")
    parser.add_argument("--method", default=None, help="vllm: speculative method (default: from the training drafter)")
    parser.add_argument("--algorithm", default=None,
                        help="sglang: speculative algorithm, e.g. EAGLE3 (default: from the training drafter)")
    parser.add_argument("--budget", type=int, default=None,
                        help="vllm (directory), per-request policies: draft tokens the batch may verify per step "
                             "(default: no budget; a serving policy picks its own)")
    parser.set_defaults(func=run)
    return parser


#: Stock vLLM methods a rule name exports as route (a), by policy kind.
STOCK_KINDS = {"vllm-eagle3": "eagle3", "vllm-ngram": "ngram"}
#: Policy kinds a rule name exports as route (b): draftrl's proposer running the head.
HEAD_RULE_KINDS = ("fixed", "stop")
#: Earlier rule names, refused by the parser naming their replacement.
RENAMED_RULES = ("head", "sam", "eagle3", "ngram")


def vllm_rule(name: str) -> Any | None:
    """The parsed rule name ``fixed:K[:V][:bB]`` / ``stop:K:S[:bB]`` (the head inside draftrl's vLLM
    proposer) or ``vllm-eagle3:...`` / ``vllm-ngram:...`` (stock vLLM), with an optional
    ``@DRAFTER``, or None when ``name`` is no such name (a run directory, a policy file). Names of
    earlier releases (``sam:2:6:t0.6``, ``eagle3:2``) are refused naming their replacement."""
    from draftrl.eval.policy_names import parse_policies

    kind = name.partition(":")[0].partition("@")[0].lower()
    if kind not in (*STOCK_KINDS, *HEAD_RULE_KINDS, *RENAMED_RULES) or Path(name).exists():
        return None
    return parse_policies([name], engine="vllm")[-1]


def rule_drafter(rule: Any, flag: str | None) -> str | None:
    """The drafter spec of a rule: its ``@DRAFTER`` or ``--drafter`` (once); None: neither.

    :raises ValueError: both given, or a drafter that runs no EAGLE-3 head where the rule needs one.
    """
    if rule.drafter is not None and flag is not None:
        raise ValueError(f"{rule.text} names its drafter and --drafter {flag} names another; give it once.")
    drafter = rule.drafter or flag
    if rule.kind == "vllm-ngram" and drafter is not None:
        raise ValueError(f"{rule.text} is vLLM's own prompt lookup, which reads no drafter; drop --drafter.")
    if drafter is not None and drafter.partition(":")[0] not in ("eagle3", "sam"):
        raise ValueError(f"drafter {drafter!r}: a vllm rule bundle runs an EAGLE-3 head; use eagle3[:DIR] or "
                         "sam:N[:DIR] "
                         "(n-gram lookup in plain vLLM: vllm-ngram:K).")
    if rule.kind in HEAD_RULE_KINDS and drafter is None:
        raise ValueError(f"{rule.text} runs the head inside draftrl's proposer: name it with --drafter eagle3[:DIR] or "
                         f"sam:N[:DIR] (or {rule.text}@eagle3); n-gram lookup in plain vLLM is vllm-ngram:K.")
    return drafter


#: What a ``--format vllm`` bundle folder holds (every kind of bundle writes some of these; ``drafter``
#: is the copied head or draft model, a folder).
BUNDLE_FILES = ("vllm.json", "proposer.json", "policy.onnx", "policy.onnx.json", "drafter")


def check_out(out: Path, fmt: str, overwrite: bool) -> None:
    """Refuse to replace an earlier export unless ``overwrite``. With it, a bundle folder's earlier
    bundle files go first (the user's other files there stay), so no file of another kind of bundle
    (a route (b) ``proposer.json`` beside a stock ``vllm.json``) survives into the new one."""
    from draftrl.io import refuse_foreign

    if fmt == "vllm" and out.suffix != ".json":
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} is a file; a vllm bundle is a folder "
                             "(or give OUT.json for static settings).")
        held = [name for name in BUNDLE_FILES if (out / name).exists()]
        if held and not overwrite:
            raise ValueError(f"--out {out} already holds an exported bundle ({', '.join(held)}); pass --overwrite "
                             "to replace it, or choose another --out.")
        refuse_foreign(out, BUNDLE_FILES, overwrite=overwrite, command="export")
        for name in held:
            if (out / name).is_dir():
                shutil.rmtree(out / name)
            else:
                (out / name).unlink()
        return
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; --format {fmt} writes a file: give a file name.")
    companion = {"onnx": ".json", "torchscript": ".json", "sglang": ".adaptive.json"}.get(fmt)
    written = [out] + ([out.with_name(out.name + companion)] if companion else [])
    earlier = [p for p in written if p.exists()]
    if earlier and not overwrite:
        raise ValueError(f"--out {out}: {', '.join(p.name for p in earlier)} already exist(s) from an earlier export; "
                         "pass --overwrite to replace them, or choose another --out.")


def run(args: argparse.Namespace) -> int:
    _options.refuse_retired(args)
    out = Path(args.out)
    try:
        bundle_dir = args.format == "vllm" and out.suffix != ".json"
        for flag, given, allowed in (("--target", args.target, bundle_dir),
                                     ("--gpu-memory-utilization", args.gpu_memory_utilization, bundle_dir),
                                     ("--tensor-parallel-size", args.tensor_parallel_size, bundle_dir),
                                     ("--cost-table", args.cost_table, args.format in ("vllm", "sglang"))):
            if given is not None and not allowed:
                raise ValueError(f"{flag} is read by --format vllm with a bundle folder"
                                 f"{'' if flag != '--cost-table' else ' and the vllm / sglang static configs'} only; "
                                 "drop it.")
        if args.drafter is not None and not (bundle_dir and vllm_rule(args.policy) is not None):
            raise ValueError("--drafter is read by --format vllm rule bundles only (fixed:K, stop:K:tT, vllm-eagle3:K "
                             "into a folder); a trained policy drafts with its run's drafter: drop it.")
        check_out(out, args.format, args.overwrite)
        if args.format in ("onnx", "torchscript"):
            from draftrl.export.network import export

            manifest_file, manifest = export(args.policy, out, args.format, check_observations=args.check_observations)
            check = manifest["check"] or {}
            print(
                f"agreement_with_sb3={check.get('action_agreement', float('nan')):.4f}  "
                f"max_abs_logit_diff={check.get('max_abs_logit_diff', float('nan')):.2e}  "
                f"observations={check.get('num_observations', 0)}  features={len(manifest['feature_names'])}  "
                f"out={out}  manifest={manifest_file}"
            )
            return 0
        derive_options = dict(saturation_tokens=args.saturation_tokens, max_batch_size=args.max_batch_size,
                              min_share=args.min_share, episodes=args.episodes, cost_table=args.cost_table)
        if args.format == "vllm" and out.suffix != ".json":
            from draftrl.export.vllm_bundle import (
                DEFAULT_GPU_MEMORY_UTILIZATION,
                write_bundle,
                write_head_bundle,
                write_stock_bundle,
            )

            memory = args.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
            rule = vllm_rule(args.policy)
            if rule is not None:
                from draftrl.decoding.vllm.head_proposer import head_spec

                if args.budget is not None:
                    raise ValueError(f"--budget {args.budget}: a rule's budget is its V (fixed:K:V); drop --budget.")
                drafter = rule_drafter(rule, args.drafter)
                min_match, head = head_spec(drafter) if drafter is not None else (None, None)
                if rule.kind in STOCK_KINDS:
                    bundle = write_stock_bundle(rule.text, out, method=STOCK_KINDS[rule.kind], depth=rule.depth,
                                                table=rule.dsd, head=head, model=args.target,
                                                gpu_memory_utilization=memory)
                else:
                    from draftrl.eval.serve.policies import proposer_rule

                    bundle = write_head_bundle(rule.text, out, depth=rule.depth, min_match=min_match,
                                               rule=proposer_rule(rule), budget=rule.verify_size, head=head,
                                               model=args.target, gpu_memory_utilization=memory)
            else:
                bundle = write_bundle(args.policy, out, target=args.target, budget=args.budget,
                                      check_observations=args.check_observations, gpu_memory_utilization=memory,
                                      derive_options=derive_options)
            if args.tensor_parallel_size not in (None, 1):
                from draftrl.export.vllm_bundle import set_tensor_parallel

                bundle = set_tensor_parallel(out, args.tensor_parallel_size)
            print(f"route={bundle['route']}  speculative_config={json.dumps(bundle['speculative_config'])}  out={out}")
            print(f"serve: {bundle['serve']}")
            return 0
        from draftrl.export import engine_config as ec

        derivation = ec.derive(args.policy, **derive_options)
        if args.format == "vllm":
            config = ec.vllm_config(derivation, method=args.method)
        else:
            adaptive_file = out.with_name(out.name + ".adaptive.json")
            config = ec.sglang_config(derivation, algorithm=args.algorithm, adaptive_file=str(adaptive_file))
        ec.check_finite(config)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(config, indent=2) + "\n")
        if args.format == "sglang":
            adaptive_file.write_text(json.dumps(config["adaptive_config"], indent=2) + "\n")
        table = " ".join(f"{s}-{e}:{k}" for s, e, k in derivation["depth_by_batch"])
        print(f"k1={derivation['k1']}  depth_by_batch={table}  "
              f"alpha={derivation['cost_model']['alpha']:.3f}  out={out}")
        return 0
    except ImportError as err:  # a missing optional dependency: one line with the install command
        print(f"draftrl export: error: {err}", file=sys.stderr)
        return 2
