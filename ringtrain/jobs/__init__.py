"""ringtrain.jobs"""
