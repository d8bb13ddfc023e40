"""Image input: configs, decoding and limits, placeholder tokens, the encoder cache
(README "Images"). The vision towers themselves live with the families in models/."""
