"""``GradientMonitor`` inside long runs: callbacks for the Hugging Face Trainer and Lightning, and
a helper for Accelerate loops. Each writes the JSONL that ``gradient-doctor logs`` reads.

- Hugging Face Trainer: ``probes.integrations.transformers.GradientDoctorCallback``::

      from gradient_doctor.probes.integrations.transformers import GradientDoctorCallback
      trainer = Trainer(..., callbacks=[GradientDoctorCallback()])
      # writes <output_dir>/gradient_doctor.jsonl

- Lightning: ``probes.integrations.lightning.GradientDoctorCallback``::

      from gradient_doctor.probes.integrations.lightning import GradientDoctorCallback
      trainer = L.Trainer(..., callbacks=[GradientDoctorCallback("grads.jsonl")])

- Accelerate (or any hand-written loop): ``probes.integrations.accelerate.monitor`` (see its
  docstring for the recipe).

Then, during or after the run: ``gradient-doctor logs grads.jsonl``.

Each of them measures what the runtime probe measures, through the optimizer's own step hooks:
per-tensor gradient norms every step, richer statistics every ``sample_every`` steps. Only the
main process (rank 0) writes. These modules import torch and their library; nothing else in
Gradient Doctor imports them.
"""
