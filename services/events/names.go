package events

// CancelChannel is the Redis pub/sub channel that asks whichever replica holds
// a task's runner stream to push Cancel: <prefix>taskrunner:task:<task-id>:cancel.
// The message is the reason as plain UTF-8 text.
func CancelChannel(prefix, taskID string) string {
	return prefix + "taskrunner:task:" + taskID + ":cancel"
}

// cancelPattern matches every CancelChannel of a prefix (PSUBSCRIBE).
func cancelPattern(prefix string) string {
	return prefix + "taskrunner:task:*:cancel"
}

// taskFromCancelChannel extracts the task id from a CancelChannel name.
func taskFromCancelChannel(prefix, channel string) (string, bool) {
	head := prefix + "taskrunner:task:"
	const tail = ":cancel"
	if len(channel) <= len(head)+len(tail) || channel[:len(head)] != head || channel[len(channel)-len(tail):] != tail {
		return "", false
	}
	return channel[len(head) : len(channel)-len(tail)], true
}
