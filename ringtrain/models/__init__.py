"""ringtrain.models"""
