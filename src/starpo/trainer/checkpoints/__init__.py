"""Training checkpoints: what one holds (`contents`), how it is written and found again
atomically with the RNG state that makes a resumed run repeat an unbroken one (`store`),
and how the trainer writes it, in its own thread or in the background (`saver`)."""
