"""Export a trained drafting policy: the network to ONNX / TorchScript, engine configs, adapters.

What goes where (each module has one job):

- ``artifacts``: find a training run's files from ``DIR/policy.zip`` (or ``DIR``, or a checkpoint).
- ``manifest``: the JSON written beside every exported file (``FILE.json``): feature names and
  order, observation normalisation, action grids, resolved training config, versions, I/O names.
- ``network``: the policy network alone (as SB3's export guide does) to ONNX or TorchScript,
  checked against SB3 on observations drawn from the policy's observation space.
- ``controller``: ``PolicyController(FILE.onnx)``: numpy + onnxruntime only, ``act(obs)``.
- ``features``: the training env's feature settings, and the env's ``FeatureBuilder`` rebuilt
  from them (so deployed observations are built by the code that built the training ones).
- ``schedule``: ``PolicySchedule``: a controller driving draftrl's own engine round by round.
- ``hf``: a Hugging Face ``transformers`` candidate generator driven by a controller.
- ``engine_config``: static configs for engines without a per-round hook (vLLM, SGLang).
- ``vllm_control``: trained policies as controllers of draftrl's vLLM proposer
  (``draftrl.decoding.vllm``: the proposers live there, export supplies what decides).
- ``vllm_bundle``: ``draftrl export --format vllm``: the folder vLLM starts from.
- ``vllm_proposer``, ``vllm_serve_proposer``: refusals that tell bundles of earlier releases to
  re-export (their classes are gone).

Importing this package imports nothing heavy; import the submodule you need.
"""

#: Formats ``draftrl export --format`` writes.
FORMATS: tuple[str, ...] = ("onnx", "torchscript", "vllm", "sglang")
