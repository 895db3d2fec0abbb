"""ringtrain.torch"""
