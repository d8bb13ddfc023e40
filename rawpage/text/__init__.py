"""Text in and out: the tokenizer, chat templates (and their budget), incremental detokenizing."""
