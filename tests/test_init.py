import fastload


def test_public_api_is_sorted_and_importable():
    assert fastload.__all__ == sorted(fastload.__all__)
    for name in fastload.__all__:
        assert getattr(fastload, name) is not None, name
