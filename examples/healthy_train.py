"""The LSTM classifier of buggy_train.py, with gradient accumulation done right.

Each micro-batch loss is divided by the accumulation steps, gradients are clipped once per
update before optimizer.step(), the total norm is logged, and gradients are zeroed after the
step. `gradient-doctor check examples/healthy_train.py` should report nothing critical.
"""

import torch
from torch import nn

ACCUM_STEPS = 4
EPOCHS = 3
BATCHES_PER_EPOCH = 64
BATCH_SIZE = 16
SEQ_LEN = 24
VOCAB = 50
CLASSES = 4


class SequenceClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(VOCAB, 64, num_layers=2, batch_first=True)
        self.head = nn.Linear(64, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # One-hot inputs instead of an embedding table: an embedding's gradient touches only
        # the rows of the tokens seen, so its norm sits far below the other layers'.
        one_hot = nn.functional.one_hot(tokens, VOCAB).float()
        hidden, _ = self.lstm(one_hot)
        return self.head(hidden[:, -1])


def make_batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(BATCHES_PER_EPOCH):
        tokens = torch.randint(0, VOCAB, (BATCH_SIZE, SEQ_LEN), generator=generator)
        labels = tokens[:, -1] % CLASSES
        batches.append((tokens, labels))
    return batches


def main() -> None:
    torch.manual_seed(0)
    model = SequenceClassifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    data = make_batches(seed=0)
    grad_norms: list[float] = []

    for epoch in range(EPOCHS):
        optimizer.zero_grad()
        for i, (tokens, labels) in enumerate(data):
            loss = loss_fn(model(tokens), labels) / ACCUM_STEPS
            loss.backward()
            if (i + 1) % ACCUM_STEPS == 0 or i + 1 == len(data):
                total_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                grad_norms.append(total_norm.item())
                optimizer.step()
                optimizer.zero_grad()
        print(f"epoch {epoch}: last loss {loss.item() * ACCUM_STEPS:.3f}, grad norm {grad_norms[-1]:.3f}")


if __name__ == "__main__":
    main()
