"""One-off measurements, each written up in docs/results/ with the command that reran it
(`python experiments/studies/<name>.py ...`). A study may import the tools (`from experiments
import plan`) and the library; nothing outside studies/ imports a study."""
